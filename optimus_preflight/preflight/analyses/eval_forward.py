"""One eval-mode, no-grad ``compute_loss`` on a batch, the model's state put back after.

Checks that observe a forward through hooks (what a module receives, what the model
returns) register them, call ``eval_forward``, and read what the hooks saw: dropout off
and BatchNorm on its running statistics, so samples are independent and outputs
deterministic unless the model samples on purpose.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


def eval_forward(ctx: PreflightContext, batch: Any) -> Any:
    """``compute_loss(model, batch)`` in eval mode without gradients; raises what it raises."""
    with preserved_training_state(ctx), torch.no_grad():
        ctx.model.eval()
        with ctx.training.plan.autocast():
            return ctx.compute_loss(ctx.model, move_to_device(batch, ctx.device))


def seeded_eval_forward(ctx: PreflightContext, batch: Any, seed: int) -> Any:
    """``eval_forward`` with the random generators reseeded to ``seed`` first and restored after:
    a loss or model that draws random numbers draws the same ones on every call with one seed."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return eval_forward(ctx, batch)


def loss_value(output: Any) -> float | None:
    """The scalar loss in what ``compute_loss`` returned (the first element of a tuple), any
    float (inf and NaN too); None when it returns something else."""
    loss = output[0] if isinstance(output, tuple) else output
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        return None
    return float(loss.detach().float())


def loss_with_output(ctx: PreflightContext, batch: Any, make: Callable[[torch.Tensor], torch.Tensor]) -> float | None:
    """The finite scalar loss of ``eval_forward`` with each tensor the model returns replaced by
    ``make(output)``: the loss judged on answers the check constructs (confident logits, risks
    ranked by time, one constant prediction), whatever the model would have said."""

    def replace(module: nn.Module, args: Any, output: Any) -> Any:
        return make(output) if isinstance(output, torch.Tensor) else output

    handle = ctx.model.register_forward_hook(replace)
    try:
        value = loss_value(eval_forward(ctx, batch))
    finally:
        handle.remove()
    return value if value is not None and math.isfinite(value) else None


def eval_loss(ctx: PreflightContext, batch: Any) -> float | None:
    """The scalar loss ``eval_forward`` returns, or None when it returns something else or a
    value that is not finite."""
    value = loss_value(eval_forward(ctx, batch))
    return value if value is not None and math.isfinite(value) else None


def model_call(ctx: PreflightContext, batch: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """The tensors (of one dim or more) the model's first call in ``eval_forward`` receives and
    returns; None when the forward raises or never reaches the model."""
    seen: list[tuple[Any, Any]] = []

    def keep(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if not seen:
            seen.append(((args, kwargs), output))

    handle = ctx.model.register_forward_hook(keep, with_kwargs=True)
    try:
        eval_forward(ctx, batch)
    except Exception:
        return None
    finally:
        handle.remove()
    if not seen:
        return None
    inputs, output = seen[0]
    return ([leaf.detach() for leaf in leaves(inputs) if isinstance(leaf, torch.Tensor) and leaf.dim() > 0],
            [leaf.detach() for leaf in leaves(output) if isinstance(leaf, torch.Tensor) and leaf.dim() > 0])


def model_outputs(ctx: PreflightContext, batch: Any) -> list[torch.Tensor] | None:
    """The tensors (of one dim or more) of the model's first output in ``eval_forward``;
    None when the forward raises or never reaches the model."""
    found = model_call(ctx, batch)
    return found[1] if found is not None else None


def eval_forward_with_grad(ctx: PreflightContext) -> Any:
    """``compute_loss`` on the first batch in eval mode with autograd on (nothing is
    backpropagated): the model's outputs carry requires_grad, which tells them from the batch's
    tensors for a TorchFunctionMode watching the step."""
    with preserved_training_state(ctx), torch.enable_grad():
        ctx.model.eval()
        with ctx.training.plan.autocast():
            return ctx.compute_loss(ctx.model, move_to_device(ctx.artifacts.first_batch, ctx.device))
