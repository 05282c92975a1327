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
from optimus_preflight.training.sharding import is_sharded

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


def build_state(parts: Restorable, *, rng_state: dict[str, Any], config: dict[str, Any], world_size: int = 1,
                sharded: bool = False) -> dict[str, Any]:
    """``rng_state`` as ``rng.capture`` returned it (at the last step boundary).
    ``sharded``: the model and optimizer are saved as DCP shards beside this state
    (``checkpoint.sharded``), so they are left out of it."""
    tensors: dict[str, Any] = {"sharded": {"format": "torch.distributed.checkpoint", "world_size": world_size}} if sharded else {
        "model": unwrap(parts.model).state_dict(),
        "optimizer": parts.optimizer.state_dict(),
    }
    return {
        **tensors,
        # The data position is per rank: a resume at another world size converts it.
        "world_size": world_size,
        # Checked on resume: another optimizer class would load these moments and mistrain.
        "optimizer_class": qualified_name(type(parts.optimizer)),
        "scheduler": parts.scheduler.state_dict() if parts.scheduler is not None else None,
        "scaler": parts.scaler.state_dict(),
        "run_state": parts.run_state.state_dict(),
        "data_position": parts.stream.state_dict(),
        "rng": rng.to_checkpoint(rng_state),
        "config": config,
    }


def apply_state(parts: Restorable, state: dict[str, Any], *, world_size: int = 1) -> str | None:
    """Load everything but the RNG (restored last, once nothing else draws from it) and,
    for a sharded checkpoint, but the model and optimizer (``sharded.load_sharded``).
    Returns what changed with the world size, if it did."""
    model = unwrap(parts.model)
    if "sharded" not in state:
        if is_sharded(model):
            from optimus_preflight.checkpoint.sharded import load_full_into_sharded  # DCP: a second of import

            load_full_into_sharded(model, parts.optimizer, state["model"], state["optimizer"])
        else:
            model.load_state_dict(state["model"])
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
    position, note = rescale_data_position(state["data_position"], int(state.get("world_size") or world_size), world_size)
    parts.stream.load_state_dict(position)
    return note


def rescale_data_position(position: dict[str, Any], saved_world_size: int, world_size: int) -> tuple[dict[str, Any], str | None]:
    """Ranks read strided shards of one epoch order, so N ranks that each consumed k
    samples consumed its first N*k: at M ranks each rank starts at N*k/M (rounded down:
    at most M-1 samples are read twice)."""
    if saved_world_size == world_size:
        return position, None
    consumed = int(position["samples_consumed"]) * saved_world_size
    per_rank = consumed // world_size
    again = consumed - per_rank * world_size
    note = (f"the checkpoint was written by {saved_world_size} rank(s) and this run has {world_size}; the {consumed} samples of epoch {position['epoch']} the ranks had read are "
            f"skipped (each rank starts at its sample {per_rank})" + (f", {again} of them are read again" if again else ""))
    return {**position, "samples_consumed": per_rank}, note
