"""What a checkpoint holds, in types ``torch.load(weights_only=True)`` accepts.

RNG states are stored as tensors, ints and lists (NumPy's array becomes a tensor), so
loading needs no allow-listed globals and cannot execute code.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

try:
    import numpy as np
except ImportError:  # numpy is optional for the checkpoint format
    np = None


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DDP/compile wrappers, whose state_dict keys are stable."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def capture_rng() -> dict[str, Any]:
    """Every RNG's state as its library returns it: cheap enough to take every step."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state() if np is not None else None,
        "torch_cpu": torch.get_rng_state(),
        "torch_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def rng_for_checkpoint(raw: dict[str, Any]) -> dict[str, Any]:
    """The states in types ``weights_only`` loading accepts (ints, lists, tensors)."""
    version, internal, gauss = raw["python"]
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "torch_cpu": raw["torch_cpu"],
        "torch_cuda": raw["torch_cuda"],
    }
    if raw.get("numpy") is not None:
        kind, keys, pos, has_gauss, cached = raw["numpy"]
        state["numpy"] = {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Restore states saved by ``rng_for_checkpoint``."""
    python = state["python"]
    random.setstate((python["version"], tuple(python["internal"]), python["gauss"]))
    torch.set_rng_state(state["torch_cpu"])
    cuda_states = state.get("torch_cuda") or []
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states[: torch.cuda.device_count()])
    numpy_state = state.get("numpy")
    if numpy_state is not None and np is not None:
        np.random.set_state(
            (
                numpy_state["kind"],
                numpy_state["keys"].numpy().astype(np.uint32),
                numpy_state["pos"],
                numpy_state["has_gauss"],
                numpy_state["cached_gaussian"],
            )
        )


@dataclass
class Restorable:
    """The live objects a checkpoint is taken from and restored into."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    run_state: Any  # RunState
    stream: Any  # BatchStream


def build_state(parts: Restorable, *, rng: dict[str, Any], config: dict[str, Any], progress: dict[str, Any]) -> dict[str, Any]:
    """``rng`` as ``capture_rng`` returned it (at the last step boundary)."""
    return {
        "model": unwrap(parts.model).state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "scheduler": parts.scheduler.state_dict() if parts.scheduler is not None else None,
        "scaler": parts.scaler.state_dict(),
        "run_state": parts.run_state.state_dict(),
        "data_position": parts.stream.state_dict(),
        "rng": rng_for_checkpoint(rng),
        "config": config,
        # Values the resumed run reports or acts on first (e.g. an eval cut short).
        "progress": progress,
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
    parts.run_state.load_state_dict(state["run_state"])
    parts.stream.load_state_dict(state["data_position"])
