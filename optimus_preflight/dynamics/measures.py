"""Training-dynamics measurements as plain functions of tensors (catalog O22, O24, O25).

Each returns Python floats, so calling one is a host synchronisation: they are meant
for the occasional dynamics step, never for every step.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.training.distributed import unwrap

# Activations whose "off" region outputs exactly 0 with a zero gradient: a unit stuck
# there is dead (O25). LeakyReLU, ELU, GELU and SiLU keep a gradient below zero.
ZERO_OFF_ACTIVATIONS: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6, nn.Hardswish, nn.Hardsigmoid, nn.Threshold)
# Every elementwise activation module whose output distribution is worth a histogram (O26).
ACTIVATIONS: tuple[type[nn.Module], ...] = ZERO_OFF_ACTIVATIONS + (
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Tanh,
    nn.Sigmoid,
    nn.LeakyReLU,
    nn.PReLU,
    nn.RReLU,
    nn.ELU,
    nn.CELU,
    nn.SELU,
    nn.Softplus,
    nn.Hardtanh,
)


def activation_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, module) for name, module in unwrap(model).named_modules() if isinstance(module, ACTIVATIONS)]


def snapshot_groups(optimizer: Optimizer) -> list[list[torch.Tensor]]:
    """A copy of every parameter, per optimizer group, taken just before ``optimizer.step()``."""
    with torch.no_grad():
        return [[p.detach().clone() for p in group["params"]] for group in optimizer.param_groups]


def update_ratios(optimizer: Optimizer, before: list[list[torch.Tensor]], group_names: list[str]) -> dict[str, float]:
    """``||W_after - W_before|| / ||W_before||`` per parameter group (O22).

    Norms are over the whole group (the square root of the sum of the squared per-tensor
    norms). Measured after the step, the ratio folds in the LR, momentum, Adam's
    preconditioning and weight decay. A group whose weights are all zero has no ratio.
    """
    numerators, denominators, names = [], [], []
    with torch.no_grad():
        for name, group, old in zip(group_names, optimizer.param_groups, before):
            params = [p.detach() for p in group["params"]]
            if not params:
                continue
            deltas = torch._foreach_sub(params, old)
            numerators.append(_group_norm(deltas))
            denominators.append(_group_norm(old))
            names.append(name)
        if not names:
            return {}
        values = torch.stack([torch.stack(numerators), torch.stack(denominators)]).cpu().tolist()  # one sync
    return {name: delta / weight for name, delta, weight in zip(names, *values) if weight > 0.0}


def _group_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    norms = torch._foreach_norm(tensors)
    device = norms[0].device
    norm = torch.linalg.vector_norm(torch.stack([n.float().to(device) for n in norms]))
    # FSDP2's sharded parameters give a DTensor: the norm over every rank's shard.
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def zero_fraction(output: torch.Tensor) -> float:
    """Share of exactly-zero entries: for a ReLU layer, the inputs it switched off."""
    return float((output == 0).sum()) / max(output.numel(), 1)


def skip_rate(skipped_now: int, skipped_before: int, step_now: int, step_before: int) -> float:
    """Share of the optimizer steps between two measurements that were skipped (O24)."""
    steps = step_now - step_before
    return (skipped_now - skipped_before) / steps if steps > 0 else 0.0


def finite_or_text(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)
