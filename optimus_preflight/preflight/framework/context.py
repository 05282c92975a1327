"""What a check may look at: the built objects of a run (a recipe's, or plain ones from
any loop), and the typed ``artifacts`` earlier checks left (``framework.artifacts``).

Conventions between checks:
- A check that reads ``artifacts.first_batch`` (or ``first_batches``, ``window_batches``)
  lists ``"data.first_batch"`` in ``requires``; the step checks read the observed first
  step through ``analyses.probe.get_probe``, computed once by ``step.first_step``.
- User data code (a dataset's ``__getitem__``/``__len__``/``__iter__``, a sampler, a
  collate_fn, a worker_init_fn, iterating a loader) is only ever called through
  ``data_access.guard.DataGuard`` (``call``, ``batches``), under
  ``preflight.first_batch_timeout_s``: a hang is reported on the check that met it,
  naming the blocking frame, and recorded in ``artifacts.data_hang`` so every later
  guarded call skips its check at once.
- A check that changes training state (runs a step, moves the model) does it inside
  ``preserve.preserved_training_state(ctx)``.
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

from optimus_preflight.preflight.framework.artifacts import Artifacts
from optimus_preflight.preflight.framework.execution import builder_of
from optimus_preflight.training.distributed import DistEnv
from optimus_preflight.training.loaders import ResumableSampler
from optimus_preflight.training.precision import make_grad_scaler
from optimus_preflight.training.training_context import TrainingContext, resolve_plan


@dataclass
class PreflightContext:
    cfg: DictConfig
    # The recipe: its builders (build_model, build_optimizer, ...) make fresh copies
    # for checks that must not touch the real objects. None for plain objects: the
    # checks then copy the live ones.
    recipe: Any
    model: nn.Module
    optimizer: Optimizer
    scheduler: Any
    train_loader: DataLoader
    val_loader: DataLoader | None
    compute_loss: Callable[[nn.Module, Any], Any]
    training: TrainingContext
    run_dir: Path
    artifacts: Artifacts = field(default_factory=Artifacts)
    # Checks run inside it: a stop signal then ends preflight at once (a first batch
    # that never comes must not hold a Ctrl+C hostage).
    interruptible: Callable[[], ContextManager] = contextlib.nullcontext
    # Whether the loop calls model.train() itself before its first step (a recipe, the
    # Lightning and Hugging Face loops do); False for a loop of the user's own, where a
    # model left in eval mode trains in eval mode.
    loop_sets_train_mode: bool = True
    # What a failed verdict does where this preflight runs, for its last console line: a
    # recipe does not start training; run_preflight raises PreflightFailed or only
    # returns the report (standalone.failure_outcome).
    failure_outcome: str = "training will not start"
    # Whether trainer.max_steps is the run's real length; False where run_preflight was given no
    # max_steps and assumed one epoch (a plain loop usually trains many): checks that judge
    # something against the run's length then assume a longer run (``assumed_epochs_at_least``).
    run_length_known: bool = True

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
    def from_objects(
        cls,
        cfg: DictConfig,
        model: nn.Module,
        optimizer: Optimizer,
        train_loader: Any,
        compute_loss: Callable[[nn.Module, Any], Any],
        *,
        run_dir: Path,
        scheduler: Any = None,
        val_loader: Any = None,
        training: TrainingContext | None = None,
    ) -> PreflightContext:
        """A context from plain objects, no recipe: ``cfg`` holds the settings the checks
        read (``trainer``, ``data``, ``preflight``); ``training`` defaults to the device and
        precision of ``cfg.trainer``, seeding nothing. Every config key applies."""
        if training is None:
            plan = resolve_plan(cfg.trainer)
            training = TrainingContext(plan.device, plan, make_grad_scaler(plan, cfg.trainer.grad_scaler),
                                       DistEnv.from_environment())
        return cls(cfg=cfg, recipe=None, model=model, optimizer=optimizer, scheduler=scheduler,
                   train_loader=train_loader, val_loader=val_loader, compute_loss=compute_loss,
                   training=training, run_dir=Path(run_dir))

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
