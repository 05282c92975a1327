"""Optimizer parameter groups and LR schedules."""

from __future__ import annotations

import logging
import math
from typing import Any

from hydra.utils import get_class
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from optimus_preflight.errors import UserError

# Keys of the optimizer schemas that are ours, not the optimizer class's.
OWN_OPTIMIZER_KEYS = ("_target_", "weight_decay", "decay_bias_and_norm")

log = logging.getLogger("optimus_preflight")


def weight_decay_groups(model: nn.Module, weight_decay: float, decay_bias_and_norm: bool) -> list[dict[str, Any]]:
    """Matrices and embeddings decay; biases and norm weights (1-D) do not (nanoGPT's rule)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if decay_bias_and_norm or weight_decay == 0.0:
        return [{"params": trainable, "weight_decay": weight_decay, "name": "all"}]
    decay = [p for p in trainable if p.dim() >= 2]
    no_decay = [p for p in trainable if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay, "name": "decay"}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "name": "no_decay"})
    return groups


def build_optimizer(node: dict[str, Any], model: nn.Module) -> Optimizer:
    """Build the optimizer named by ``node['_target_']`` over the model's trainable params."""
    try:
        optimizer_class = get_class(node["_target_"])
    except Exception as error:
        raise UserError(
            f"cannot import the optimizer class {node['_target_']!r} ({error})",
            key="optimizer._target_",
            fix="Use an importable class such as torch.optim.AdamW, or pick optimizer=adamw|sgd.",
        ) from None
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in node.items() if k not in OWN_OPTIMIZER_KEYS}
    groups = weight_decay_groups(model, node.get("weight_decay", 0.0), node.get("decay_bias_and_norm", False))
    return optimizer_class(groups, **kwargs)


def group_names(optimizer: Optimizer) -> list[str]:
    return [str(group.get("name", index)) for index, group in enumerate(optimizer.param_groups)]


class WarmupCosine:
    """LR factor: linear warmup to 1, then cosine decay to ``min_lr_ratio``.

    A callable object rather than a lambda so LambdaLR's state_dict stores it.
    """

    def __init__(self, warmup_steps: int, total_steps: int, min_lr_ratio: float):
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_lr_ratio = min_lr_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_cosine(optimizer: Optimizer, warmup_steps: int, min_lr_ratio: float, total_steps: int,
                  warmup_fraction: float | None = None) -> LambdaLR:
    return LambdaLR(optimizer, WarmupCosine(fitted_warmup(warmup_steps, warmup_fraction, total_steps), total_steps, min_lr_ratio))


def fitted_warmup(warmup_steps: int, warmup_fraction: float | None, total_steps: int) -> int:
    """The warmup in steps: a fraction of the schedule when given; a warmup as long as the
    run (the LR would never reach its peak) is cut to a tenth of it, with a warning."""
    if warmup_fraction is not None:
        if not 0 <= warmup_fraction < 1:
            raise UserError(f"scheduler.warmup_fraction must be in [0, 1), got {warmup_fraction}",
                            key="scheduler.warmup_fraction", fix="Set scheduler.warmup_fraction=0.05 (5% of the run).")
        return round(warmup_fraction * total_steps)
    if total_steps > 0 and warmup_steps >= total_steps:
        fitted = total_steps // 10
        log.warning("scheduler.warmup_steps=%d is not shorter than the %d-step schedule: the LR would never reach "
                    "optimizer.lr; warming up for %d steps instead (set scheduler.warmup_fraction=0.05 to size it "
                    "with the run)", warmup_steps, total_steps, fitted)
        return fitted
    return warmup_steps


class LinearWarmup:
    def __init__(self, warmup_steps: int):
        self.warmup_steps = warmup_steps

    def __call__(self, step: int) -> float:
        return min((step + 1) / self.warmup_steps, 1.0) if self.warmup_steps > 0 else 1.0


def constant(optimizer: Optimizer, warmup_steps: int = 0) -> LambdaLR:
    return LambdaLR(optimizer, LinearWarmup(warmup_steps))
