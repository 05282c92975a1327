"""The memory a training step may use: the configured target GPU, else the local one; host
RAM for a job that trains on the CPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.memory import cuda_rules
from optimus_preflight.memory.result import GIB, gib
from optimus_preflight.preflight.analyses.sizes import dense_parts, local_storage
from optimus_preflight.training.distributed import unwrap

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

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


def gpu_precision(ctx: PreflightContext) -> str:
    """The precision the job will use on the GPU, also when checked from a CPU machine."""
    if ctx.device.type == "cuda":
        return ctx.training.plan.precision
    requested = str(ctx.cfg.trainer.precision)
    # auto picks bf16 on a GPU that supports it (every GPU worth a target check does).
    return "bf16" if requested == "auto" else requested



def host_memory_held(ctx: PreflightContext) -> int:
    """Bytes the live model and optimizer already hold in RAM (counted in the estimate too)."""
    seen: set[int] = set()
    total = 0
    model = unwrap(ctx.model)
    tensors = list(model.parameters()) + list(model.buffers())
    tensors += [v for state in ctx.optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    for tensor in dense_parts(tensors):
        if tensor.device.type != "cpu":
            continue
        storage = local_storage(tensor)
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def host_memory_limit(ctx: PreflightContext, available: int, held: int) -> MemoryLimit:
    """Host RAM a CPU training step may use: what is ``available`` plus what the live model
    and optimizer already ``held`` (the estimate counts them too), less the reserve."""
    reserve_gib = float(ctx.cfg.preflight.memory.reserve_gib)
    return MemoryLimit(
        int(available + held - reserve_gib * GIB),
        f"this machine has {gib(available)} of RAM available + {gib(held)} already held by the model "
        f"and optimizer, less the {reserve_gib:g} GiB reserve (preflight.memory.reserve_gib)",
        "preflight.memory.reserve_gib",
    )
