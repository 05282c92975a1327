"""What a check may look at: the recipe's built objects, and artifacts earlier checks left.

Conventions between checks:
- ``artifacts["first_batch"]``: the real first training batch (as the loader yields it,
  on the CPU), stored by the ``data.first_batch`` check. Checks that need a batch list
  ``"data.first_batch"`` in ``requires``. ``artifacts["first_batches"]``: one batch per
  worker for an IterableDataset, to compare them; ``artifacts["window_batches"]``: every
  batch it fetched (two when a micro-batch of one sample must be split for accumulation).
- ``artifacts["step_probe"]``: the observed first real step (``probe.get_probe``),
  computed once by ``step.first_step`` and read by the other step checks.
- ``artifacts["sample_hashes"]``: per-sample digests of the first batch, compared
  across ranks at the end of preflight.
- User data code (a dataset's ``__getitem__``/``__len__``/``__iter__``, a sampler, a
  collate_fn, a worker_init_fn, iterating a loader) is only ever called through
  ``guard.DataGuard`` (``call``, ``batches``), under ``preflight.first_batch_timeout_s``:
  a hang is reported on the check that met it, naming the blocking frame, and recorded
  in ``artifacts["data_hang"]`` so every later guarded call skips its check at once.
  A check that reads samples also ``requires`` ``"data.first_batch"``.
- A check that changes training state (runs a step, moves the model) does it inside
  ``snapshot.preserved_training_state(ctx)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager

import torch
from omegaconf import DictConfig
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from optimus_preflight.preflight.framework.execution import builder_of
from optimus_preflight.training.loaders import ResumableSampler
from optimus_preflight.training.training_context import TrainingContext


@dataclass
class PreflightContext:
    cfg: DictConfig
    # The recipe: its builders (build_model, build_optimizer, ...) make fresh copies
    # for checks that must not touch the real objects.
    recipe: Any
    model: nn.Module
    optimizer: Optimizer
    scheduler: Any
    train_loader: DataLoader
    val_loader: DataLoader | None
    compute_loss: Callable[[nn.Module, Any], Any]
    training: TrainingContext
    run_dir: Path
    artifacts: dict[str, Any] = field(default_factory=dict)
    # Checks run inside it: a stop signal then ends preflight at once (a first batch
    # that never comes must not hold a Ctrl+C hostage).
    interruptible: Callable[[], ContextManager] = contextlib.nullcontext

    @property
    def weights_materialized(self) -> bool:
        """False for a model kept on the meta device (``strategy.build_for_verdict``)."""
        return not any(param.is_meta for param in self.model.parameters())

    @property
    def device(self) -> torch.device:
        return self.training.device

    def key_applies(self, key: str) -> bool:
        """Whether setting ``key`` changes this run: False for a group (data, model,
        optimizer, scheduler) whose builder the recipe overrides without calling the
        default one, which is what reads the group."""
        builder = builder_of(key)
        used = getattr(self.recipe, "default_builders_used", None)
        if builder is None or used is None or builder in used:
            return True
        # A recipe's own build_dataloaders() that calls build_loader(dataset, cfg.data, ...)
        # reads the data keys too; build_loader's loaders are the ones with its sampler.
        return builder == "build_dataloaders" and isinstance(getattr(self.train_loader, "sampler", None), ResumableSampler)

    @classmethod
    def from_recipe(cls, recipe: Any) -> PreflightContext:
        return cls(
            cfg=recipe.cfg,
            recipe=recipe,
            model=recipe.model,
            optimizer=recipe.optimizer,
            scheduler=recipe.scheduler,
            train_loader=recipe.train_loader,
            val_loader=recipe.val_loader,
            compute_loss=recipe.compute_loss,
            training=recipe.training_context,
            run_dir=recipe.run_dir,
            interruptible=getattr(recipe, "interruptible", contextlib.nullcontext),
        )
