"""Which implementation an optimizer step takes, and builders that force another one (O11).

torch's optimizers have three step implementations with different memory (measured with
``measure_step_memory`` on torch 2.13, two 512x512 layers per group up to eight):
- ``foreach`` (CUDA's default when neither ``foreach`` nor ``fused`` is given): each op
  runs on all parameters of a group at once, so its temporaries span them all: Adam,
  AdamW, NAdam, RAdam, Adamax and RMSprop hold one extra copy of every parameter at the
  peak of the step, Adagrad two, SGD with momentum and weight decay one (plain SGD none);
- the per-tensor loop (``foreach=False``; the CPU default): the same temporaries for one
  parameter at a time, so the largest parameter's size;
- ``fused=True`` (Adam, AdamW, SGD, Adagrad; CUDA and CPU): one kernel, no temporaries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim import Optimizer

FOREACH = "foreach"
FOR_LOOP = "for-loop"
FUSED = "fused"
CUSTOM = "custom"  # an optimizer without torch's foreach/fused switches
MIXED = "mixed"  # groups that take different paths

Builder = Callable[[nn.Module], Optimizer]


def step_implementation(optimizer: Optimizer, device: str | torch.device) -> str:
    """The path ``optimizer.step()`` takes for parameters on ``device``: the group's own
    choice, else torch's default (foreach on CUDA, the loop elsewhere)."""
    if "foreach" not in optimizer.defaults:
        return CUSTOM
    on_cuda = torch.device(device).type == "cuda"
    paths = set()
    for group in optimizer.param_groups:
        if group.get("fused"):
            paths.add(FUSED)
        elif group.get("foreach") or (group.get("foreach") is None and on_cuda and not group.get("differentiable")):
            paths.add(FOREACH)
        else:
            paths.add(FOR_LOOP)
    return paths.pop() if len(paths) == 1 else MIXED


def supports_fused(optimizer: Optimizer) -> bool:
    return "fused" in optimizer.defaults


@dataclass(frozen=True)
class _Switched:
    """``build_optimizer`` with every group switched to one step implementation. Frozen, so
    two variants of one builder compare equal and the estimates keyed by builder (one trace
    per builder) are shared between checks instead of traced again."""

    build_optimizer: Builder
    implementation: str  # "per_tensor" | "fused"

    def __call__(self, model: nn.Module) -> Optimizer:
        optimizer = self.build_optimizer(model)
        if self.implementation == "per_tensor":
            for group in optimizer.param_groups:
                if not group.get("fused"):
                    group["foreach"] = False
        elif supports_fused(optimizer):
            for group in optimizer.param_groups:
                group["fused"], group["foreach"] = True, None
        return optimizer


def per_tensor(build_optimizer: Builder) -> Builder:
    """The same optimizer with every group on the per-tensor loop (``foreach=False``)."""
    return _Switched(build_optimizer, "per_tensor")


def fused(build_optimizer: Builder) -> Builder:
    """The same optimizer with every group fused (for optimizers that have the switch)."""
    return _Switched(build_optimizer, "fused")
