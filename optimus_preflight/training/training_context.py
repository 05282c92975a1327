"""The context every step runs in: device, precision, seeds and the GradScaler.

``TrainingContext`` is also a read-only mapping with the keys of the optimus_dl
interface (``scaler``, ``amp_ctx``, ``amp_cfg``, ``device``): a loop written against
``setup_training_context(device) -> dict`` indexes it, ours reads its attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from optimus_preflight.config.schema import TrainerConfig
from optimus_preflight.training.distributed import DistEnv
from optimus_preflight.training.precision import PrecisionPlan, make_grad_scaler, resolve_device, resolve_precision
from optimus_preflight.training.rng import seed_everything


class ReusableAutocast:
    """``amp_ctx``: an autocast context that may be entered again and again (and nested),
    unlike one ``torch.autocast`` object, which a loop would have to rebuild per step."""

    def __init__(self, plan: PrecisionPlan):
        self.plan = plan
        self._open: list[Any] = []

    def __enter__(self) -> None:
        context = self.plan.autocast()
        context.__enter__()
        self._open.append(context)

    def __exit__(self, *exc: Any) -> bool | None:
        return self._open.pop().__exit__(*exc)


@dataclass(eq=False)
class TrainingContext(Mapping):
    device: torch.device
    plan: PrecisionPlan
    scaler: torch.amp.GradScaler
    dist: DistEnv

    @property
    def precision(self) -> str:
        return self.plan.precision

    @property
    def amp_ctx(self) -> ReusableAutocast:
        return ReusableAutocast(self.plan)

    _KEYS = ("scaler", "amp_ctx", "amp_cfg", "device", "precision", "dist")

    def __getitem__(self, key: str) -> Any:
        if key == "amp_cfg":
            return self.plan  # the resolved precision and device: what autocast runs with
        if key not in self._KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)


def resolve_plan(trainer: TrainerConfig, device: torch.device | str | None = None) -> PrecisionPlan:
    """Pure resolution (no seeding, no allocation): also used to validate a config.
    ``device`` (a torch.device or name) overrides ``trainer.device``."""
    resolved = torch.device(device) if device is not None else resolve_device(trainer.device)
    return PrecisionPlan(resolve_precision(trainer.precision, resolved), resolved)


def build_training_context(trainer: TrainerConfig, dist: DistEnv | None = None, *,
                           device: torch.device | str | None = None) -> TrainingContext:
    plan = resolve_plan(trainer, device)
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
