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
indices reaches a fraction of a percent.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from torch.utils.data import WeightedRandomSampler

from optimus_preflight.preflight.checks.batch_checks import sampler_chain
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.epoch_replay import can_skip_by_index

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MAX_DRAWS = 16_384  # indices drawn at most (one epoch when shorter): milliseconds for torch's samplers
MIN_DRAWS = 16  # fewer draws say nothing about coverage
COVERAGE_FLOOR = 0.05  # of the distinct indices uniform draws would reach

PER_SAMPLE_FIX = ("Give WeightedRandomSampler one weight per sample, the weight of its class: "
                  "class_weights = 1.0 / torch.bincount(labels); "
                  "WeightedRandomSampler(class_weights[labels], num_samples=len(labels)), with labels the "
                  "training dataset's label of each sample, in dataset order.")


def expected_distinct(size: int, draws: int) -> float:
    """Distinct values among ``draws`` uniform draws with replacement from ``range(size)``."""
    return size * -math.expm1(draws * math.log1p(-1 / size)) if size > 1 else float(min(size, draws))


def _key(index: Any) -> Any:
    return index.item() if hasattr(index, "item") and getattr(index, "ndim", 1) == 0 else index


def draw_indices(index_sampler: Iterable[Any], limit: int, batched: bool) -> list[Any]:
    """Up to ``limit`` indices from a sampler, or from a batch sampler's batches."""
    drawn: list[Any] = []
    for item in itertools.islice(iter(index_sampler), limit):
        if batched:
            drawn.extend(_key(index) for index in (item.tolist() if hasattr(item, "tolist") else item))
        else:
            drawn.append(_key(item))
        if len(drawn) >= limit:
            break
    return drawn[:limit]


def _epoch_draws(index_sampler: Any, batch_size: int | None) -> int | None:
    try:
        length = len(index_sampler)
    except TypeError:
        return None
    return length * (batch_size or 1)


class SamplerCoverageCheck(Check):
    """The training sampler reaches only a small part of the dataset."""

    name = "data.sampler_coverage"
    stage = Stage.DATA
    codes = ("SAMPLER_COVERAGE",)

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
        index_sampler = loader._index_sampler
        epoch = _epoch_draws(index_sampler, loader.batch_size)
        limit = min(epoch or MAX_DRAWS, MAX_DRAWS)
        with preserved_data_state(ctx):  # drawing advances the samplers' generators and the global RNG
            drawn = guard.call(draw_indices, index_sampler, limit, loader._auto_collation,
                               what="the training sampler's indices")
        try:
            distinct = len(set(drawn))
        except TypeError:  # keys that cannot be told apart by value
            findings.data["summary"] = "the sampler's keys are not hashable"
            return
        expected = expected_distinct(size, len(drawn))
        findings.data.update(draws=len(drawn), distinct=distinct, expected_uniform=round(expected, 1))
        findings.data["summary"] = f"{distinct} distinct of {len(drawn)} indices drawn, dataset of {size}"
        if len(drawn) < MIN_DRAWS or distinct >= COVERAGE_FLOOR * expected:
            return
        sampler = type(sampler_chain(loader)[-1]).__name__
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
