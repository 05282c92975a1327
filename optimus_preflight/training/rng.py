"""Every RNG a training run draws from: seeding, capture, restore, checkpoint form."""

from __future__ import annotations

import random
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # numpy is optional for torch
    np = None


def capture() -> dict[str, Any]:
    """States as their libraries return them: cheap enough to take every step."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state() if np is not None else None,
        "torch_cpu": torch.get_rng_state(),
        # Reading CUDA's state would initialise CUDA in a process that never used it.
        "torch_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
    }


def restore(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    if state.get("numpy") is not None and np is not None:
        np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch_cpu"])
    if state["torch_cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"][: torch.cuda.device_count()])


def to_checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """The states in types ``torch.load(weights_only=True)`` accepts: ints, lists, tensors."""
    version, internal, gauss = state["python"]
    saved: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "torch_cpu": state["torch_cpu"],
        "torch_cuda": list(state["torch_cuda"]),
    }
    if state.get("numpy") is not None:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        saved["numpy"] = {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    return saved


def from_checkpoint(saved: dict[str, Any]) -> dict[str, Any]:
    python = saved["python"]
    numpy_state = saved.get("numpy")
    return {
        "python": (python["version"], tuple(python["internal"]), python["gauss"]),
        "numpy": None
        if numpy_state is None or np is None
        else (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        ),
        "torch_cpu": saved["torch_cpu"],
        "torch_cuda": saved.get("torch_cuda") or [],
    }


def seed_everything(seed: int, *, deterministic: bool = False) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if np is not None:
        np.random.seed(seed % 2**32)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=False)
        torch.backends.cudnn.benchmark = False
