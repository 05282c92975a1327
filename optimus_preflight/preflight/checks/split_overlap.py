"""Label leakage through the split (``data.split_overlap``): a validation loader that reads
training samples, found from the datasets' structure (the same dataset, or Subsets of one
with shared indices) or from per-sample digests of a bounded number of samples of each:
warning.
"""

from __future__ import annotations

import operator
import time
from typing import TYPE_CHECKING, Any

from torch.utils.data import Subset

from optimus_preflight.preflight.checks.batch_checks import is_map_style
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.data_access.samples import sample_digest
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

TRAIN_SAMPLES = 1024  # with VAL_SAMPLES: ~0.15 s on the char-LM (0.5 s at 4096)
VAL_SAMPLES = 256
SCAN_BUDGET_S = 2.0  # a slow (not hung) dataset is read for this long at most
OVERLAP_ESTIMATE = 0.25  # warn when about this share of the validation set is training data


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


def read_digests(dataset: Any, indices: list[int], guard: DataGuard, deadline: float) -> list[str]:
    digests = []
    for index in indices:
        if digests and time.perf_counter() > deadline:
            break
        digests.append(sample_digest(guard.call(operator.getitem, dataset, index, what=f"dataset[{index}]")))
    return digests


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
            self._same_dataset(train_root, train_indices, val_indices, guard, findings)
            return
        if not (is_map_style(train) and is_map_style(val)):
            findings.data["summary"] = "not compared (an IterableDataset cannot be read by index)"
            return
        with preserved_data_state(ctx):  # random transforms draw from the global RNGs
            self._compare_contents(train, val, guard, findings)

    @staticmethod
    def _same_dataset(root: Any, train_indices: list[int] | None, val_indices: list[int] | None, guard: DataGuard,
                      findings: Findings) -> None:
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

    @staticmethod
    def _compare_contents(train: Any, val: Any, guard: DataGuard, findings: Findings) -> None:
        train_size = guard.call(len, train, what="len(train dataset)")
        val_size = guard.call(len, val, what="len(validation dataset)")
        deadline = time.perf_counter() + SCAN_BUDGET_S
        train_read = read_digests(train, spread(train_size, TRAIN_SAMPLES), guard, deadline)
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
        if shared >= 2 and estimate >= OVERLAP_ESTIMATE:
            SplitOverlapCheck._warn(
                findings,
                f"{shared} of {len(val_read)} validation samples read are identical to one of the "
                f"{len(train_read)} training samples read (of {train_size}): about {estimate:.0%} of the "
                "validation set is training data")

    @staticmethod
    def _warn(findings: Findings, what: str) -> None:
        how = ("split once, into disjoint parts (torch.utils.data.random_split with one seeded generator, or "
               "disjoint index or file lists), and build the validation loader on the held-out part only.")
        findings.warning(
            "LEAK_SPLIT",
            f"{what}; validation then measures memorisation, not generalisation, and looks better than the model is",
            "Where the datasets are built, " + how,
            "data.val",
            code_fix="For the datasets of the DataLoaders your build_dataloaders() returns, " + how,
        )
