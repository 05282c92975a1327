"""What a checkpoint holds, in types ``torch.load(weights_only=True)`` accepts.

RNG states are stored as tensors, ints and lists (NumPy's array becomes a tensor), so
loading needs no allow-listed globals and cannot execute code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.training import rng
from optimus_preflight.training.distributed import unwrap

if TYPE_CHECKING:
    from optimus_preflight.training.run_state import RunState
    from optimus_preflight.training.stream import BatchStream


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass
class Restorable:
    """The live objects a checkpoint is taken from and restored into."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    run_state: RunState
    stream: BatchStream


def build_state(parts: Restorable, *, rng_state: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """``rng_state`` as ``rng.capture`` returned it (at the last step boundary)."""
    return {
        "model": unwrap(parts.model).state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        # Checked on resume: another optimizer class would load these moments and mistrain.
        "optimizer_class": qualified_name(type(parts.optimizer)),
        "scheduler": parts.scheduler.state_dict() if parts.scheduler is not None else None,
        "scaler": parts.scaler.state_dict(),
        "run_state": parts.run_state.state_dict(),
        "data_position": parts.stream.state_dict(),
        "rng": rng.to_checkpoint(rng_state),
        "config": config,
    }


def apply_state(parts: Restorable, state: dict[str, Any]) -> None:
    """Load everything but the RNG (restored last, once nothing else draws from it)."""
    unwrap(parts.model).load_state_dict(state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    if parts.scheduler is not None and state["scheduler"] is not None:
        scheduler_state = dict(state["scheduler"])
        if "lr_lambdas" in scheduler_state:
            # The schedule's shape comes from the current config (a longer max_steps
            # must stretch it); the checkpoint supplies only its position.
            scheduler_state["lr_lambdas"] = [None] * len(scheduler_state["lr_lambdas"])
        parts.scheduler.load_state_dict(scheduler_state)
    if state["scaler"]:  # empty when saved by a disabled (non-fp16) scaler
        parts.scaler.load_state_dict(state["scaler"])
    # Checkpoints before RunState held the losses kept them under "progress".
    parts.run_state.load_state_dict({**(state.get("progress") or {}), **state["run_state"]})
    parts.stream.load_state_dict(state["data_position"])
