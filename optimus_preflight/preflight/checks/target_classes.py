"""More batches for a one-class verdict (``step.targets``). The step sees one batch, and
a batch of an imbalanced binary task can hold one class by chance (at 5% positives, a
batch of 32 has none 19% of the time). So when the first batch's targets hold a single
value, the loader is read on (labels only, no forward) until another value shows up,
``ONE_CLASS_MIN_TARGETS`` targets are seen, the epoch ends or the budget runs out.

The labels are found in the batch as the leaf whose kept values are exactly the
criterion's one value: the same tensor, or the one it was flattened or shifted from.
A constant target that is not in the batch is built by ``compute_loss`` on purpose
(MoCo's InfoNCE: ``labels = zeros(N)``, the positive at index 0; a GAN's all-real
labels), and says nothing about the data: no verdict.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.target_profile import ONE_CLASS_MIN_TARGETS
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.analyses.loss_spy import CriterionCall
    from optimus_preflight.preflight.framework import Findings
    from optimus_preflight.preflight.framework.context import PreflightContext

SCAN_BATCHES = 32
SCAN_BUDGET_S = 2.0


def _kept(leaf: torch.Tensor, ignore_index: int | None) -> torch.Tensor:
    return leaf[leaf != ignore_index] if ignore_index is not None and not leaf.is_floating_point() else leaf.reshape(-1)


def label_leaf(batch: Any, call: CriterionCall) -> int | None:
    """Index (in ``leaves(batch)`` order) of the tensor holding the criterion's labels:
    one of the target's size first (an all-ones attention mask beside all-one labels is
    not the labels), else one it was shifted or reshaped from."""
    value, hard = call.profile.only_value, call.hard_targets
    matches = []
    for index, leaf in enumerate(leaves(batch)):
        if not isinstance(leaf, torch.Tensor) or leaf.dim() == 0 or leaf.is_floating_point() == hard:
            continue
        kept = _kept(leaf, call.ignore_index)
        if kept.numel() and bool((kept == value).all()):
            matches.append((leaf.numel() != call.profile.total, index))
    return min(matches)[1] if matches else None


def scan_labels(ctx: PreflightContext, findings: Findings, check: str, call: CriterionCall) -> tuple[int, int, bool]:
    """(targets seen, batches read, whole epoch read) while every label equals the first
    batch's one value; (0, n, False) as soon as another value shows up, or when the
    target is not one of the batch's tensors."""
    seen, batches = call.profile.kept, 1
    index = label_leaf(ctx.artifacts.first_batch, call)
    if index is None:
        return 0, batches, False
    if seen >= ONE_CLASS_MIN_TARGETS or ctx.artifacts.data_hang is not None:
        return seen, batches, False  # enough already; or the data code hung once: no more calls into it
    guard = DataGuard(ctx, check, findings)
    seen, batches, started = 0, 0, time.perf_counter()
    with preserved_data_state(ctx), guard.batches(ctx.train_loader, "labels for step.targets") as stream:
        for batch in stream:
            found = list(leaves(batch))
            if index >= len(found) or not isinstance(found[index], torch.Tensor):
                return seen, batches, False  # another batch structure: judge no further
            kept = _kept(found[index], call.ignore_index)
            if bool((kept != call.profile.only_value).any()):
                return 0, batches + 1, False
            seen, batches = seen + kept.numel(), batches + 1
            if seen >= ONE_CLASS_MIN_TARGETS or batches >= SCAN_BATCHES or \
                    time.perf_counter() - started > SCAN_BUDGET_S:
                return seen, batches, False
    return seen, batches, True
