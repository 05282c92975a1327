"""The context every step runs in: device, precision, seeds and the GradScaler."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from optimus_preflight.config.schema import TrainerConfig
from optimus_preflight.training.distributed import DistEnv
from optimus_preflight.training.precision import PrecisionPlan, make_grad_scaler, resolve_device, resolve_precision
from optimus_preflight.training.rng import seed_everything


@dataclass
class TrainingContext:
    device: torch.device
    plan: PrecisionPlan
    scaler: torch.amp.GradScaler
    dist: DistEnv

    @property
    def precision(self) -> str:
        return self.plan.precision


def resolve_plan(trainer: TrainerConfig) -> PrecisionPlan:
    """Pure resolution (no seeding, no allocation): also used to validate a config."""
    device = resolve_device(trainer.device)
    return PrecisionPlan(resolve_precision(trainer.precision, device), device)


def build_training_context(trainer: TrainerConfig, dist: DistEnv | None = None) -> TrainingContext:
    plan = resolve_plan(trainer)
    dist = dist or DistEnv.from_environment()
    # Every rank starts from the same weights; DDP would broadcast them anyway, but the
    # same seed keeps a 1-process and an N-process run comparable.
    seed_everything(trainer.seed, deterministic=trainer.deterministic)
    return TrainingContext(
        device=plan.device,
        plan=plan,
        scaler=make_grad_scaler(plan, trainer.grad_scaler),
        dist=dist,
    )
