"""Gradient utilities on torch's foreach kernels: no Python loop of kernels per parameter."""

from __future__ import annotations

import torch
from torch.optim import Optimizer


def params_with_grads(optimizer: Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def scale_grads_(params: list[torch.Tensor], factor: float | torch.Tensor) -> None:
    if isinstance(factor, torch.Tensor):
        # A tensor factor keeps the decision on the device: no host synchronisation.
        buckets: dict[torch.device, list[torch.Tensor]] = {}
        for p in params:
            buckets.setdefault(p.grad.device, []).append(p.grad)
        for device, grads in buckets.items():
            torch._foreach_mul_(grads, factor.to(device))
    elif factor != 1.0 and params:
        torch._foreach_mul_([p.grad for p in params], factor)


def total_norm(params: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm over all gradients, computed as torch's clip_grad_norm_ computes it."""
    if not params:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
    # FSDP2's sharded gradients give a replicated DTensor: the norm over every rank's shard.
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def clip_grads_(params: list[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
