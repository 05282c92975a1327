"""The optimizer step of an FSDP2 rank, run on the shards' local tensors for speed.

Under FSDP2 the parameters, their gradients and so the optimizer state are DTensors
sharded on dim 0; every op of ``optimizer.step()`` is elementwise and runs on the local
shards, allocating exactly what the same op on the local tensors would. On fake tensors,
DTensor's sharding propagation of foreach ops over hundreds of parameters costs seconds
per op (a 7B model: half the trace), so the estimate steps a copy of the optimizer (same
class, hyperparameters, groups and foreach/fused choice) built over the local tensors,
pointing their ``.grad`` at the local gradients before each step. The memory is the
same, as the validation against real FSDP2 steps with the DTensor optimizer shows.
When the copy cannot be built (an optimizer whose constructor takes other arguments),
the real optimizer runs on the DTensors.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.optim import Optimizer


class LocalShardOptimizer:
    """What ``run_training_steps`` needs of an optimizer (``step``, ``zero_grad``,
    ``state``, ``param_groups``, ``defaults``), stepping the local shards."""

    def __init__(self, optimizer: Optimizer, inner: Optimizer, pairs: list[tuple[torch.Tensor, torch.Tensor]]):
        self.original = optimizer
        self.inner = inner
        self.pairs = pairs  # (sharded DTensor parameter, its local tensor)

    @property
    def state(self) -> Any:
        return self.inner.state

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        return self.inner.defaults

    def step(self) -> None:
        for sharded, local in self.pairs:
            grad = sharded.grad
            local.grad = None if grad is None else getattr(grad, "_local_tensor", grad)
        self.inner.step()
        for _, local in self.pairs:
            local.grad = None  # the DTensor gradient still holds it until zero_grad

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.original.zero_grad(set_to_none=set_to_none)
        for _, local in self.pairs:
            local.grad = None


def on_local_shards(optimizer: Optimizer) -> Optimizer | LocalShardOptimizer:
    """The optimizer to step in the trace: a copy over the local shards when every
    parameter is a DTensor and the copy can be built, else ``optimizer`` itself."""
    from torch.distributed.tensor import DTensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not params or not all(isinstance(p, DTensor) for p in params):
        return optimizer
    accepted = inspect.signature(type(optimizer).__init__).parameters
    if "params" not in accepted:
        return optimizer
    local_of: dict[int, torch.Tensor] = {}
    pairs = []
    for p in params:
        if id(p) not in local_of:
            local = p._local_tensor.detach().requires_grad_(p.requires_grad)
            local_of[id(p)] = local
            pairs.append((p, local))
    groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": [local_of[id(p)] for p in group["params"]]}
              for group in optimizer.param_groups]
    kwargs = {key: value for key, value in optimizer.defaults.items() if key in accepted}
    try:
        inner = type(optimizer)(groups, **kwargs)
    except Exception:  # a constructor that wants more than groups and its defaults
        return optimizer
    return LocalShardOptimizer(optimizer, inner, pairs)
