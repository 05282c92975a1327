"""Snapshots of the state a PreflightContext exposes, shared by the checks of one run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from optimus_preflight.checkpoint.training_snapshot import TrainingStateSnapshot
from optimus_preflight.training.learnable import loss_modules, loss_tensors

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

def snapshot_of(ctx: PreflightContext) -> TrainingStateSnapshot:
    """A snapshot of the state a PreflightContext exposes."""
    return TrainingStateSnapshot(
        ctx.model,
        ctx.optimizer,
        ctx.scheduler,
        ctx.training.scaler,
        loaders=(ctx.train_loader, ctx.val_loader),
        # A trial step's backward also reaches the loss's own learnable tensors.
        extra_tensors=[tensor for _, tensor in loss_tensors(ctx.compute_loss, ctx.model)],
        held_modules=[module for _, module in held_modules(ctx)],
    )


def held_modules(ctx: PreflightContext) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) for the modules the loss function holds outside the model, while together
    no larger than the model: a momentum encoder or an EMA copy, whose values a trial step
    changes and the snapshot restores. A larger frozen teacher is left uncopied (its weights
    do not change)."""
    budget = sum(tensor.numel() for tensor in ctx.model.state_dict().values())
    held = []
    for name, module in loss_modules(ctx.compute_loss, ctx.model):
        size = sum(tensor.numel() for tensor in module.state_dict().values())
        if size <= budget:
            held.append((name, module))
            budget -= size
    return held


@contextlib.contextmanager
def preserved_training_state(ctx: PreflightContext) -> Iterator[TrainingStateSnapshot]:
    """Restore the training state however the block exits.

    Reuses the snapshot ``run_preflight`` takes before the first check (one copy of the
    weights per preflight, not one per check); a check run on its own takes its own.
    """
    snapshot = ctx.artifacts.snapshot or snapshot_of(ctx)
    try:
        yield snapshot
    finally:
        snapshot.restore()


@contextlib.contextmanager
def preserved_data_state(ctx: PreflightContext) -> Iterator[TrainingStateSnapshot]:
    """For checks that only read data: RNGs and loader generators/samplers, not the model."""
    snapshot = TrainingStateSnapshot(None, loaders=(ctx.train_loader, ctx.val_loader))
    try:
        yield snapshot
    finally:
        snapshot.restore()
