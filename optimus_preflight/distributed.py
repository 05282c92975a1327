"""torchrun support: where this process sits, the process group, DDP wrapping, reductions.

A single process is rank 0 of 1, and every helper here is then a no-op, so the rest of
the code calls them unconditionally.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_environment(cls) -> DistEnv:
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        )


def init_process_group(env: DistEnv, timeout_s: float = 1800.0) -> None:
    """gloo on CPU, nccl on GPUs; torchrun's environment supplies the rendezvous."""
    if not env.is_distributed or torch_dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank)
        backend = "nccl"
    else:
        backend = "gloo"
    torch_dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))


def destroy_process_group() -> None:
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def is_active() -> bool:
    return torch_dist.is_available() and torch_dist.is_initialized() and torch_dist.get_world_size() > 1


def broadcast_object(value, src: int = 0):
    """Rank ``src``'s value on every rank (e.g. the run dir every rank must share)."""
    if not is_active():
        return value
    holder = [value]
    torch_dist.broadcast_object_list(holder, src=src)
    return holder[0]


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch_dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_sum(value: torch.Tensor | int | float) -> torch.Tensor:
    """Sum over ranks; returns a tensor on the device the backend reduces on."""
    tensor = torch.as_tensor(value, dtype=torch.float64 if not isinstance(value, torch.Tensor) else None)
    if not is_active():
        return tensor
    device = _collective_device()
    reduced = tensor.detach().to(device, copy=True)
    torch_dist.all_reduce(reduced, op=torch_dist.ReduceOp.SUM)
    return reduced


def wrap_model(model: nn.Module, device: torch.device, find_unused_parameters: bool = False) -> nn.Module:
    """DDP under torchrun; the plain module otherwise."""
    if not is_active():
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=find_unused_parameters)
