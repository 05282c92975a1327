"""A training sampler that can only ever draw a few of the dataset's samples
(``data.sampler_coverage``).

The classic: ``WeightedRandomSampler(class_weights, num_samples=len(dataset))`` with one
weight per *class* instead of per sample. The sampler draws indices in
``range(len(weights))``, so every batch is made of samples 0..C-1: the model sees C
samples for the whole run, the loss falls fast and nothing generalises. Said directly
by the weights' length, and measured for any sampler: the indices of one epoch (up to
``MAX_DRAWS``) drawn from the loader's own index sampler, with every RNG and generator
put back afterwards, against the distinct indices uniform draws with replacement would
give. Balancing a skewed dataset by per-sample weights (the healthy form) repeats the
minority and still reaches a good part of that: about 0.7 at 95/5 with two classes, 0.16
with nine classes of ten samples beside one of 9,910; a sampler stuck on a handful of
indices reaches a fraction of a percent, one batch repeated a few percent.

A sampler whose epoch is short is drawn for several epochs: a
``SubsetRandomSampler(range(48))`` left from an "overfit one batch" session draws 48
distinct indices per epoch, as uniform draws would, and only across epochs shows that
they are always the same 48. Two more defects show in whole epochs: every epoch draws
the same set, without repeats, and that set is under a third of the dataset (a subset
that is not a train/validation split: the validation loader's indices over the same
dataset count as covered), and a batch sampler whose epoch ends far before its own
``len()`` says (a bucketing sampler that returns after its first bucket).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import WeightedRandomSampler

from optimus_preflight.preflight.checks.batch_checks import sampler_chain
from optimus_preflight.preflight.checks.data_checks import expected_distinct
from optimus_preflight.preflight.checks.val_loader import length_of
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.epoch_replay import can_skip_by_index

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MAX_DRAWS = 16_384  # indices drawn at most (one epoch when shorter): milliseconds for torch's samplers
MIN_DRAWS = 16  # fewer draws say nothing about coverage
# Of the distinct indices uniform draws would reach. The healthy extreme is balancing a
# skewed dataset by per-sample weights, ~0.16 (see above); a batch sampler that yields one
# batch of 32 over and over from 640 samples reaches 0.058.
COVERAGE_FLOOR = 0.1
MAX_EPOCHS = 64  # passes over a short-epoch sampler
# An epoch that is always the same subset: under a third of the dataset is not a train
# split (80/10/10, 70/15/15, 60/20/20 and 50/50 all train on more).
SUBSET_FLOOR = 1 / 3
# A batch sampler whose epoch yields under half the batches its len() promises.
LENGTH_FLOOR = 0.5

PER_SAMPLE_FIX = ("Give WeightedRandomSampler one weight per sample, the weight of its class: "
                  "class_weights = 1.0 / torch.bincount(labels); "
                  "WeightedRandomSampler(class_weights[labels], num_samples=len(labels)), with labels the "
                  "training dataset's label of each sample, in dataset order.")


def _key(index: Any) -> Any:
    return index.item() if hasattr(index, "item") and getattr(index, "ndim", 1) == 0 else index


@dataclass
class Epochs:
    """What whole passes over a sampler gave: the indices in order, each complete epoch's
    indices, and how many items (indices, or batches for a batch sampler) each yielded."""

    indices: list[Any] = field(default_factory=list)
    complete: list[list[Any]] = field(default_factory=list)
    items: list[int] = field(default_factory=list)


def draw_epochs(index_sampler: Iterable[Any], limit: int, batched: bool, max_epochs: int = MAX_EPOCHS) -> Epochs:
    """Passes over a sampler (or a batch sampler's batches) until ``limit`` indices or
    ``max_epochs`` passes: one pass of a long epoch, many of a short one."""
    drawn = Epochs()
    while len(drawn.indices) < limit and len(drawn.items) < max_epochs:
        epoch: list[Any] = []
        items = 0
        ended = True
        for item in iter(index_sampler):
            items += 1
            if batched:
                epoch.extend(_key(index) for index in (item.tolist() if hasattr(item, "tolist") else item))
            else:
                epoch.append(_key(item))
            if len(drawn.indices) + len(epoch) >= limit:
                ended = False
                break
        drawn.indices.extend(epoch)
        drawn.items.append(items)
        if ended:
            drawn.complete.append(epoch)
        if not epoch:
            break
    drawn.indices = drawn.indices[:limit]
    return drawn


def _epoch_draws(index_sampler: Any, batch_size: int | None) -> int | None:
    length = length_of(index_sampler)
    return None if length is None else length * (batch_size or 1)


# num_samples at this share of the weighted samples or more, drawn without replacement:
# each is drawn about once whatever its weight (a weighted subsample stays well below).
NO_REPLACEMENT_SHARE = 0.9
MAX_WEIGHT_GROUPS = 20  # per-class weights: a handful of distinct values; per-sample ones are many


class SamplerCoverageCheck(Check):
    """The training sampler reaches only a small part of the dataset."""

    name = "data.sampler_coverage"
    stage = Stage.DATA
    codes = ("SAMPLER_COVERAGE", "SAMPLER_NO_REPLACEMENT")

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.train_loader
        if not can_skip_by_index(loader) or not hasattr(loader.dataset, "__len__"):
            findings.data["summary"] = "no index sampler over a sized dataset"
            return
        guard = DataGuard(ctx, self.name, findings)
        size = guard.call(len, loader.dataset, what="len(dataset)")
        findings.data["dataset_size"] = size
        if self._weights_per_class(sampler_chain(loader), size, findings) or size < 2:
            return
        if self._replicas_not_the_run(sampler_chain(loader), ctx.training.dist.world_size, size, findings):
            return
        if not self._without_replacement(sampler_chain(loader), findings):
            self._weights_favour_the_common(sampler_chain(loader), findings)
        index_sampler = loader._index_sampler
        batched = loader._auto_collation
        # Enough draws that uniform ones would reach most of the dataset (or MAX_DRAWS).
        limit = min(max(2 * size, _epoch_draws(index_sampler, loader.batch_size) or 0), MAX_DRAWS)
        with preserved_data_state(ctx):  # drawing advances the samplers' generators and the global RNG
            epochs = guard.call(draw_epochs, index_sampler, limit, batched, what="the training sampler's indices")
        drawn = epochs.indices
        try:
            distinct = len(set(drawn))
        except TypeError:  # keys that cannot be told apart by value
            findings.data["summary"] = "the sampler's keys are not hashable"
            return
        expected = expected_distinct(size, len(drawn))
        findings.data.update(draws=len(drawn), distinct=distinct, expected_uniform=round(expected, 1),
                             epochs=len(epochs.items))
        findings.data["summary"] = (f"{distinct} distinct of {len(drawn)} indices drawn in {len(epochs.items)} "
                                    f"epoch(s), dataset of {size}")
        sampler = type(sampler_chain(loader)[-1]).__name__
        if len(drawn) < MIN_DRAWS:
            return
        if distinct >= COVERAGE_FLOOR * expected:
            self._short_epochs(ctx, loader, epochs, size, sampler, findings)
            return
        findings.error(
            "SAMPLER_COVERAGE",
            f"the training sampler ({sampler}) drew only {distinct} distinct indices in {len(drawn)} draws from a "
            f"dataset of {size} (uniform draws would reach ~{expected:.0f}): training sees the same few samples "
            "over and over and never the rest",
            "Check what the sampler is built from: one weight per sample for WeightedRandomSampler (not per class), "
            "the full list of training indices for SubsetRandomSampler, a custom sampler's range(len(dataset)).",
        )

    @staticmethod
    def _weights_per_class(chain: list[Any], size: int, findings: Findings) -> bool:
        """Report a WeightedRandomSampler whose weights do not match the dataset; True when reported."""
        sampler = next((item for item in chain if isinstance(item, WeightedRandomSampler)), None)
        if sampler is None or len(sampler.weights) == size:
            return False
        count = len(sampler.weights)
        findings.data.update(weights=count)
        findings.data["summary"] = f"WeightedRandomSampler with {count} weights for {size} samples"
        if count < size:
            what = (f"it draws indices 0..{count - 1} only, so {size - count} of the {size} samples are never "
                    "trained on" + (" (one weight per class, not per sample?)" if count <= 1000 else ""))
        else:
            what = f"it draws indices up to {count - 1}, past the dataset's end: an IndexError, or the wrong rows"
        findings.error(
            "SAMPLER_COVERAGE",
            f"the WeightedRandomSampler has {count} weights but the training dataset has {size} samples: {what}",
            PER_SAMPLE_FIX,
        )
        return True

    @staticmethod
    def _without_replacement(chain: list[Any], findings: Findings) -> bool:
        """A WeightedRandomSampler(replacement=False) asked for (nearly) every sample each
        epoch: without replacement each index is drawn at most once, so an epoch of
        num_samples close to the number of weighted samples is every sample once, in an
        order the weights only bias. True when reported."""
        sampler = next((item for item in chain if isinstance(item, WeightedRandomSampler)), None)
        if sampler is None or sampler.replacement:
            return False
        weights = torch.as_tensor(sampler.weights, dtype=torch.float64)
        positive = weights[weights > 0]
        drawable = len(positive)
        if drawable < 2 or len(positive.unique()) < 2 or sampler.num_samples < NO_REPLACEMENT_SHARE * drawable:
            return False  # uniform weights (a shuffle), or a weighted subsample of the dataset
        share = min(1.0, sampler.num_samples / drawable)
        spread = float(positive.max() / positive.min())
        findings.data.update(no_replacement_draws=sampler.num_samples, weighted_samples=drawable)
        findings.warning(
            "SAMPLER_NO_REPLACEMENT",
            f"the WeightedRandomSampler draws num_samples={sampler.num_samples} with replacement=False from "
            f"{drawable} samples of non-zero weight: without replacement each index is drawn at most once, so every "
            f"epoch reads {share:.0%} of them, each once, whatever their weights (which differ up to "
            f"{spread:.3g}x): the weights only reorder the epoch, and the classes stay about as imbalanced as in the dataset",
            "Draw with replacement, the default: WeightedRandomSampler(weights, num_samples=len(weights), "
            "replacement=True), so rare samples repeat as often as their weights ask.",
        )
        return True

    @staticmethod
    def _weights_favour_the_common(chain: list[Any], findings: Findings) -> None:
        """A WeightedRandomSampler meant to balance classes whose per-sample weights grow
        with the size of their group: class counts where 1 / count belongs. Read from the
        weights alone: samples of one class share one weight, so the groups of equal
        weights are the classes, and each group's share of the draws is weight x size."""
        sampler = next((item for item in chain if isinstance(item, WeightedRandomSampler)), None)
        if sampler is None:
            return
        weights = torch.as_tensor(sampler.weights, dtype=torch.float64)
        values, sizes = weights.unique(return_counts=True)
        if not 2 <= len(values) <= MAX_WEIGHT_GROUPS or bool((values <= 0).any()):
            return
        sizes = sizes.double()
        drawn = values * sizes / float((values * sizes).sum())
        present = sizes / sizes.sum()
        rarest = int(sizes.argmin())
        order = sizes.argsort()
        if not (bool((values[order].diff() > 0).all()) and float(drawn[rarest]) < 0.5 * float(present[rarest])):
            return
        findings.data.update(weight_groups=len(values), rarest_share=round(float(present[rarest]), 4),
                             rarest_drawn=round(float(drawn[rarest]), 4))
        findings.warning(
            "SAMPLER_COVERAGE",
            f"the WeightedRandomSampler's weights grow with the size of their group ({len(values)} groups of equal "
            f"weight, the classes): the rarest group, {float(present[rarest]):.1%} of the samples, is drawn "
            f"{float(drawn[rarest]):.2%} of the time, rarer than without the sampler. Weights proportional to the "
            "class counts do this",
            "Weight each sample by the inverse of its class's count: weights = 1.0 / class_counts[labels] (then "
            "every class is drawn about equally often).",
        )

    @staticmethod
    def _replicas_not_the_run(chain: list[Any], world_size: int, size: int, findings: Findings) -> bool:
        """A sharding sampler (DistributedSampler's num_replicas/rank) built for another
        number of processes than this run has; True when reported."""
        sampler = next((item for item in chain if isinstance(getattr(item, "num_replicas", None), int)), None)
        if sampler is None or sampler.num_replicas == world_size:
            return False
        replicas, rank = sampler.num_replicas, getattr(sampler, "rank", None)
        findings.data.update(num_replicas=replicas, world_size=world_size)
        if replicas > world_size:
            what = (f"this process reads only its 1/{replicas} shard ({size // replicas} of {size} samples) and the "
                    f"shards of ranks {world_size}..{replicas - 1}, which no process runs, are never trained on")
        else:
            what = (f"each of the {world_size} processes reads 1/{replicas} of the dataset where it should read "
                    f"1/{world_size}: the ranks train on the same samples and every epoch is {world_size // replicas}x "
                    "longer than the run assumes")
        findings.error(
            "SAMPLER_COVERAGE",
            f"the training loader's {type(sampler).__name__} was built with num_replicas={replicas}"
            + (f", rank={rank}" if rank is not None else "") + f" but this run has {world_size} process(es): {what}",
            "Let the sampler read the run's size: DistributedSampler(dataset) takes num_replicas and rank from the "
            "initialised process group (or pass dist.get_world_size() and dist.get_rank()); in a single process, "
            "use shuffle=True instead of a DistributedSampler, and call sampler.set_epoch(epoch) each epoch when "
            "distributed.",
        )
        return True

    def _short_epochs(self, ctx: PreflightContext, loader: Any, epochs: Epochs, size: int, sampler: str,
                      findings: Findings) -> None:
        """Whole epochs that reach a fixed small part of the dataset, or end early."""
        batched = loader._auto_collation
        declared = length_of(loader._index_sampler)
        if batched and declared and epochs.complete and epochs.items[0] < LENGTH_FLOOR * declared:
            findings.data.update(declared_batches=declared, yielded_batches=epochs.items[0])
            findings.warning(
                "SAMPLER_COVERAGE",
                f"the training batch sampler ({sampler}) ends its epoch after {epochs.items[0]} batches "
                f"({len(epochs.complete[0])} samples of {size}), though its len() is {declared}: the rest of the "
                "dataset is never drawn",
                "Check the batch sampler's __iter__ yields every batch its __len__ counts: every bucket or group, "
                "not only the first (a return or break inside its loop).",
            )
            return
        if len(epochs.complete) < 2:
            return
        first = epochs.complete[0]
        subset = set(first)
        if len(subset) != len(first) or any(set(epoch) != subset for epoch in epochs.complete[1:]):
            return  # repeats within an epoch, or epochs that differ: a sampler that draws, not a subset
        shards = max((getattr(item, "num_replicas", 1) or 1 for item in sampler_chain(loader)), default=1)
        reachable = size / shards
        held_out = _val_indices(ctx.val_loader, loader.dataset)
        covered = len(subset | held_out)
        findings.data.update(epoch_subset=len(subset), val_indices_same_dataset=len(held_out))
        if covered >= SUBSET_FLOOR * reachable:
            return
        prefix = subset == set(range(len(subset)))
        where = (f", the first {len(subset)} indices (range({len(subset)}), a prefix such as range(len(dataset) // 4)): "
                 "only that part of the dataset is ever trained on, and a dataset stored in an order (by time, class, "
                 "size or energy) is seen at one end only" if prefix else "")
        findings.warning(
            "SAMPLER_COVERAGE",
            f"every epoch of the training sampler ({sampler}) draws the same {len(subset)} of the dataset's {size} "
            f"samples ({100 * len(subset) / size:.1f}%){where}, and no validation loader over the same dataset takes "
            "the rest: the other samples are never trained on (a debugging subset left in?)",
            "Give the sampler every training index (e.g. SubsetRandomSampler(train_indices) with the whole training "
            "split, or shuffle=True), or make the dataset itself the subset (torch.utils.data.Subset) if a small "
            "run is what you want.",
        )


def _val_indices(val_loader: Any, dataset: Any) -> set[Any]:
    """The indices a validation loader reads from the training loader's own dataset: a
    split made by two samplers over one dataset. Sequential or subset samplers only
    (no randomness drawn); empty when the loaders hold different datasets."""
    if val_loader is None or getattr(val_loader, "dataset", None) is not dataset:
        return set()
    sampler = getattr(val_loader, "sampler", None)
    indices = getattr(sampler, "indices", None)
    if indices is not None:
        return {_key(index) for index in indices}
    length = length_of(sampler)
    return set(range(length)) if type(sampler).__name__ == "SequentialSampler" and length else set()
