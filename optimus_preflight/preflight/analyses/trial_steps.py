"""A trial step on a context's objects, built as training builds its own step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer

from optimus_preflight.training.step import StepRunner, runner_from_config

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


def make_runner(ctx: PreflightContext, model: nn.Module, optimizer: Optimizer, *, scheduler: Any = None, scaler: Any = None,
                accumulation_steps: int | None = None, clip: bool = True) -> StepRunner:
    """A trial step built as training builds its own (``runner_from_config``)."""
    return runner_from_config(ctx.cfg.trainer, ctx.training, model, optimizer, ctx.compute_loss, scheduler=scheduler,
                              scaler=scaler, accumulation_steps=accumulation_steps, clip=clip)
