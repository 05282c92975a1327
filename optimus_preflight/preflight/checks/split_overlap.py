"""Label leakage through the split (``data.split_overlap``): a validation loader that reads
training samples, found from the datasets' structure (the same dataset, or Subsets of one
with shared indices) or from per-sample digests of a bounded number of samples of each:
warning. Disjoint indices into one table are compared by content too: a table that holds
duplicate rows puts copies on both sides of a split by index.
"""

from __future__ import annotations

import operator
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Subset

from optimus_preflight.preflight.checks.batch_checks import is_map_style
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.data_access.samples import sample_digest
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

TRAIN_SAMPLES = 1024  # with VAL_SAMPLES: ~0.15 s on the char-LM (0.5 s at 4096)
VAL_SAMPLES = 256
SCAN_BUDGET_S = 2.0  # a slow (not hung) dataset is read for this long at most
OVERLAP_ESTIMATE = 0.25  # warn when about this share of the validation set is training data
# ... or when this share of the validation samples read already matched (with at least
# OBSERVED_MIN of them). The estimate extrapolates from the training samples read, which
# natural repeats inflate (the default char-LM's 32-character windows of Python sources:
# 1.6% seen, ~9% estimated); what is seen directly is a floor, and 5% of it is no accident.
OBSERVED_SHARE = 0.05
OBSERVED_MIN = 3
FEW_FIELDS = 8  # integer values per sample's inputs, at most, for them to be a few ids or categories
CHANCE_FACTOR = 2.0  # validation twins in training vs training twins in training: within this, chance
TWINS_REPEATED = 0.3  # training samples read that equal another one: the data repeats itself
FEW_DISTINCT = 0.25  # distinct training samples read, as a share of those read: a task of few possible inputs
# (each one drawn 4 times or more among those read; rows copied 3 times keep a third distinct)


def subset_root(dataset: Any) -> tuple[Any, list[int] | None]:
    """The dataset under nested ``Subset`` wrappers and the indices into it they select
    (None: all of it)."""
    indices: list[int] | None = None
    while isinstance(dataset, Subset):
        own = [int(i) for i in dataset.indices]
        indices = own if indices is None else [own[i] for i in indices]
        dataset = dataset.dataset
    return dataset, indices


def spread(size: int, count: int) -> list[int]:
    """Up to ``count`` indices spread evenly over range(size)."""
    if size <= count:
        return list(range(size))
    return sorted({round(i * (size - 1) / (count - 1)) for i in range(count)})


def _single_valued(leaf: Any) -> bool | None:
    """For a tensor or array of more than one value, whether all its values are equal."""
    if isinstance(leaf, torch.Tensor) and leaf.numel() > 1 and leaf.layout == torch.strided:
        flat = leaf.detach().reshape(-1)
        return bool((flat == flat[0]).all())
    if isinstance(leaf, np.ndarray) and leaf.size > 1:
        flat = leaf.reshape(-1)
        return bool((flat == flat[0]).all())
    return None  # a scalar (a label), or not an array


def is_blank(sample: Any) -> bool:
    """Whether every tensor or array of a sample that has more than one value holds a single
    value (a blank image, a row of padding): equal copies of it say nothing of a split."""
    verdicts = [verdict for verdict in map(_single_valued, leaves(sample)) if verdict is not None]
    return bool(verdicts) and all(verdicts)


def few_discrete_values(sample: Any) -> bool:
    """Whether a sample's inputs (its first tensor or array) are a few ids or categories: an
    integer tensor of at most ``FEW_FIELDS`` values (a user and an item, label-encoded columns).
    Such inputs come from a small space, where equal samples are draws of one point, not copies."""
    first = next((leaf for leaf in leaves(sample) if isinstance(leaf, (torch.Tensor, np.ndarray))), None)
    return few_integers(first, FEW_FIELDS)


def few_integers(values: Any, limit: int) -> bool:
    """Whether ``values`` (a tensor or array) holds at most ``limit`` integers."""
    if isinstance(values, torch.Tensor):
        return not values.is_floating_point() and not values.is_complex() and values.numel() <= limit
    if isinstance(values, np.ndarray):
        return values.dtype.kind in "iub" and values.size <= limit
    return False


def read_digests(dataset: Any, indices: list[int], guard: DataGuard, deadline: float,
                 discrete: list[bool] | None = None) -> list[str]:
    """Digests of the samples at ``indices`` (blank ones left out), until ``deadline``; with
    ``discrete``, each sample's ``few_discrete_values`` is appended to it."""
    digests = []
    for read, index in enumerate(indices):
        if read and time.perf_counter() > deadline:
            break
        sample = guard.call(operator.getitem, dataset, index, what=f"dataset[{index}]")
        if not is_blank(sample):
            digests.append(sample_digest(sample))
            if discrete is not None:
                discrete.append(few_discrete_values(sample))
    return digests


def within_share(digests: list[str]) -> float:
    """The share of ``digests`` equal to another one of them."""
    counts = Counter(digests)
    return sum(count for count in counts.values() if count > 1) / max(len(digests), 1)


class SplitOverlapCheck(Check):
    """The validation loader reads samples of the training set."""

    name = "data.split_overlap"
    stage = Stage.DATA
    codes = ("LEAK_SPLIT",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if ctx.val_loader is None:
            findings.data["summary"] = "no validation loader"
            return
        train, val = getattr(ctx.train_loader, "dataset", None), getattr(ctx.val_loader, "dataset", None)
        if train is None or val is None:
            findings.data["summary"] = "loaders without a dataset"
            return
        guard = DataGuard(ctx, self.name, findings)
        train_root, train_indices = subset_root(train)
        val_root, val_indices = subset_root(val)
        if train_root is val_root:
            shared = self._same_dataset(train_root, train_indices, val_indices, guard, findings)
            if shared or train_indices is None or val_indices is None or not is_map_style(train_root):
                return
            # Disjoint indices; the rows they select can still be equal.
            with preserved_data_state(ctx):
                self._compare_contents(train, val, guard, findings, disjoint=True)
            return
        if not (is_map_style(train) and is_map_style(val)):
            findings.data["summary"] = "not compared (an IterableDataset cannot be read by index)"
            return
        with preserved_data_state(ctx):  # random transforms draw from the global RNGs
            self._compare_contents(train, val, guard, findings)

    @staticmethod
    def _same_dataset(root: Any, train_indices: list[int] | None, val_indices: list[int] | None, guard: DataGuard,
                      findings: Findings) -> int:
        """Report training samples the validation loader selects by index; their count."""
        if train_indices is None and val_indices is None:
            size = guard.call(len, root, what="len(dataset)")
            shared, total, how = size, size, "reads the training dataset itself"
        else:
            how = "selects indices of the dataset the training loader also reads"
            if val_indices is None:  # all of it, so every training index
                total, shared = guard.call(len, root, what="len(dataset)"), len(set(train_indices or ()))
            elif train_indices is None:
                total = shared = len(set(val_indices))
            else:
                val_set = set(val_indices)
                total, shared = len(val_set), len(val_set.intersection(train_indices))
        findings.data.update(shared=shared, validation_samples=total, exact=True)
        findings.data["summary"] = f"{shared} of {total} validation samples are training samples"
        if shared:
            SplitOverlapCheck._warn(findings, f"the validation loader {how}: {shared} of its {total} samples are "
                                              "training samples")
        return shared

    @staticmethod
    def _compare_contents(train: Any, val: Any, guard: DataGuard, findings: Findings, disjoint: bool = False) -> None:
        train_size = guard.call(len, train, what="len(train dataset)")
        val_size = guard.call(len, val, what="len(validation dataset)")
        deadline = time.perf_counter() + SCAN_BUDGET_S
        discrete: list[bool] = []
        train_read = read_digests(train, spread(train_size, TRAIN_SAMPLES), guard, deadline, discrete)
        val_read = read_digests(val, spread(val_size, VAL_SAMPLES), guard, deadline + SCAN_BUDGET_S / 4)
        if not train_read or not val_read:
            return
        known = set(train_read)
        shared = sum(digest in known for digest in val_read)
        # Were the validation set all training data, about this share of it would be found.
        coverage = len(train_read) / max(train_size, 1)
        estimate = min(shared / len(val_read) / coverage, 1.0)
        findings.data.update(shared=shared, validation_read=len(val_read), training_read=len(train_read),
                             estimated_share=round(estimate, 4), exact=False)
        findings.data["summary"] = (f"{shared} of {len(val_read)} validation samples read equal one of "
                                    f"{len(train_read)} training samples read")
        observed = shared / len(val_read)
        if not ((shared >= 2 and estimate >= OVERLAP_ESTIMATE) or (shared >= OBSERVED_MIN and observed >= OBSERVED_SHARE)):
            return
        distinct = len(set(train_read))
        findings.data["distinct_training_read"] = distinct
        within = within_share(train_read)
        findings.data["training_twins_share"] = round(within, 4)
        if discrete and all(discrete) and observed <= CHANCE_FACTOR * within + 2 / len(val_read):
            findings.info(
                "LEAK_SPLIT",
                f"{shared} of {len(val_read)} validation samples read equal training samples, but the inputs are a "
                f"few ids or categories and training samples repeat among themselves as often ({within:.0%} of "
                f"those read equal another one; {observed:.0%} of the validation samples read equal one): the "
                "space of inputs is small, and a sample in both splits is the same point drawn twice, not a copy",
                "Nothing to do if the task's inputs are this few; to measure unseen combinations, hold out whole "
                "ids (users, items, categories) for validation.",
            )
            return
        if distinct <= FEW_DISTINCT * len(train_read):
            # Not a split that leaks: a task with few possible samples (counting sequences,
            # a small grid of configurations) repeats them everywhere. Copied rows (a scrape
            # saved three times) still leave a third of the rows distinct.
            findings.info(
                "LEAK_SPLIT",
                f"{shared} of {len(val_read)} validation samples read equal training samples, but the training data "
                f"itself holds only {distinct} distinct samples among the {len(train_read)} read: the task has few "
                "possible inputs, so any split of it overlaps, and validation measures those same samples",
                "If unseen inputs matter, hold out whole kinds of inputs (e.g. ranges of start values or lengths) for "
                "validation; if the task's inputs really are this few, the overlap is expected.",
            )
            return
        if not disjoint and within > 0 and observed <= CHANCE_FACTOR * within + 2 / len(val_read):
            # Validation meets training samples about as often as training meets itself: both are
            # draws from one space that repeats, not a split that hands training rows to validation.
            findings.info(
                "LEAK_SPLIT",
                f"{shared} of {len(val_read)} validation samples read equal training samples, about as often as "
                f"training samples equal each other ({within:.0%} of those read equal another one): the data repeats "
                "itself (short prompts, small grids of configurations, common words), so separately built splits "
                "share samples by chance, and validation partly measures those",
                "If the repeats are copies (rows saved twice, an oversampled file appended to itself), drop duplicates "
                "before splitting (pandas DataFrame.drop_duplicates()); if the task has few possible inputs, the "
                "overlap is expected: to measure unseen inputs, hold out whole kinds of inputs for validation.",
            )
            return
        what = (f"{shared} of {len(val_read)} validation samples read are identical to one of the "
                f"{len(train_read)} training samples read (of {train_size}): about {estimate:.0%} of the "
                "validation set is training data")
        if not disjoint and within >= TWINS_REPEATED:
            SplitOverlapCheck._warn(
                findings,
                what + f". The training data repeats itself as much ({within:.0%} of the training samples read equal "
                "another one): the samples are drawn from few distinct ones, or rows were copied, so separately built "
                "splits share them",
                dedupe=True)
        elif disjoint:
            SplitOverlapCheck._warn(
                findings,
                "the split's indices are disjoint, but the rows they select are not: " + what + ". The table holds "
                "duplicate rows, and a split by index puts copies of one row on both sides",
                dedupe=True)
        else:
            SplitOverlapCheck._warn(findings, what)

    @staticmethod
    def _warn(findings: Findings, what: str, dedupe: bool = False) -> None:
        how = ("split once, into disjoint parts (torch.utils.data.random_split with one seeded generator, or "
               "disjoint index or file lists), and build the validation loader on the held-out part only.")
        if dedupe:
            how = ("drop duplicate rows before splitting (pandas DataFrame.drop_duplicates(), or keep the first "
                   "index of each content hash), or split by group so every copy lands on one side "
                   "(sklearn GroupShuffleSplit with a key shared by the copies).")
        findings.warning(
            "LEAK_SPLIT",
            f"{what}; validation then measures memorisation, not generalisation, and looks better than the model is",
            "Where the datasets are built, " + how,
            "data.val",
            code_fix="For the datasets of the DataLoaders your build_dataloaders() returns, " + how,
        )
