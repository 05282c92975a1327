"""The GPU memory a training step may use: the configured target GPU, else the local one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from optimus_preflight.memory import cuda_rules
from optimus_preflight.memory.result import GIB, gib

NEAR_LIMIT = 0.9  # warn when the need is above this share of the limit


@dataclass
class MemoryLimit:
    bytes: int
    description: str
    key: str


def gpu_memory_limit(cfg: Any, device: torch.device) -> MemoryLimit | None:
    """Usable GPU bytes for tensors: the configured target, else the local GPU, else None."""
    memory = cfg.preflight.memory
    fraction, reserve = float(memory.usable_fraction), float(memory.reserve_gib) * GIB
    context = cuda_rules.CUDA_CONTEXT_BYTES
    if memory.target_gib is not None:
        total = float(memory.target_gib) * GIB
        usable = min(fraction * total, total - reserve) - context
        return MemoryLimit(
            int(usable),
            f"a {memory.target_gib:g} GiB GPU (preflight.memory.target_gib) leaves {gib(usable)} for tensors "
            f"= min({fraction:.0%} of it, it - {memory.reserve_gib:g} GiB reserve) - {gib(context)} CUDA context",
            "preflight.memory.target_gib",
        )
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    free, _ = torch.cuda.mem_get_info(device)
    # What this process already holds (the model, the optimizer) is in use, not lost.
    held = torch.cuda.memory_reserved(device)
    usable = min(fraction * total - context, free + held - reserve)
    return MemoryLimit(
        int(usable),
        f"{torch.cuda.get_device_name(device)} leaves {gib(usable)} for tensors = min({fraction:.0%} of "
        f"{gib(total)} - {gib(context)} CUDA context, {gib(free)} free + {gib(held)} held by this process "
        f"- {memory.reserve_gib:g} GiB reserve)",
        "preflight.memory.usable_fraction",
    )
