"""What is trained, beyond ``model.parameters()``: learnable tensors kept as plain
attributes of the model (not registered), and learnable tensors of the loss (a loss
module's weights, a learnable loss weight) that get a gradient but no optimizer update.

The walks are ``training.learnable``; the optimizer decides what changes, so each
finding says whether it holds the tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import leaves, move_to_device
from optimus_preflight.training.learnable import loss_leaves, loss_tensors, orphaned_tensors, unregistered_tensors
from optimus_preflight.training.step import split_loss_output

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


def _names(items: list[str], limit: int = 5) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def optimized_ids(optimizer: torch.optim.Optimizer) -> set[int]:
    return {id(param) for group in optimizer.param_groups for param in group["params"]}


def _describe(name: str, tensor: torch.Tensor) -> str:
    if not isinstance(tensor, nn.Parameter):
        kind = "a tensor with requires_grad=True"
    elif "]." in name:
        kind = "of a layer in a plain container"
    else:
        kind = "an nn.Parameter in a plain container"
    return f"{name} ({kind})"


REGISTER_FIX = ("Register them as parameters: self.scale = nn.Parameter(torch.ones(1)) instead of "
                "torch.ones(1, requires_grad=True) (an nn.Parameter assigned to a module attribute is registered), "
                "nn.ParameterList / nn.ParameterDict (or nn.ModuleList) instead of a plain list or dict; then build "
                "the optimizer from model.parameters().")


class UnregisteredTensorsCheck(Check):
    """Learnable tensors the model's modules hold outside their registered parameters."""

    name = "model.unregistered_tensors"
    stage = Stage.MODEL
    codes = ("PARAM_UNREGISTERED",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loose = unregistered_tensors(ctx.model)
        in_optimizer = optimized_ids(ctx.optimizer)
        left_out = [_describe(name, tensor) for name, tensor in loose if id(tensor) not in in_optimizer]
        added = [_describe(name, tensor) for name, tensor in loose if id(tensor) in in_optimizer]
        orphans = [f"{name} (computed from a tensor with requires_grad: {tensor.grad_fn.name()})"
                   for name, tensor in orphaned_tensors(ctx.model)]
        findings.data.update(unregistered=len(loose), not_in_optimizer=len(left_out), orphaned=len(orphans))
        findings.data["summary"] = f"{len(loose)} learnable tensor(s) outside the registered parameters"
        missed = ("model.to(device) leaves them where they are, and state_dict() (so every checkpoint) does not "
                  "save them")
        if left_out:
            findings.error(
                "PARAM_UNREGISTERED",
                f"{len(left_out)} learnable tensor(s) of the model are not registered parameters: "
                f"{_names(left_out)}. model.parameters() does not list them, so the optimizer does not hold them "
                f"and they never change; {missed}",
                REGISTER_FIX,
            )
        if orphans:
            findings.error(
                "PARAM_UNREGISTERED",
                f"{len(orphans)} tensor(s) the model keeps are the result of an operation on a learnable tensor, not "
                f"the learnable tensor itself: {_names(orphans)}. Gradients flow through them to a leaf that neither "
                "the model nor the optimizer holds, so what the forward uses never changes",
                "Make the operation first and the parameter last: self.w = nn.Parameter(torch.randn(n) * 0.01), not "
                "torch.randn(n, requires_grad=True) * 0.01 or nn.Parameter(...).cuda() (move the whole model with "
                "model.to(device) instead).",
            )
        if added:
            findings.warning(
                "PARAM_UNREGISTERED",
                f"{len(added)} learnable tensor(s) of the model are not registered parameters: {_names(added)}. "
                f"The optimizer holds them, but {missed}: a resumed run restarts them from their initial values",
                REGISTER_FIX,
            )


@contextmanager
def first_batch_loss(ctx: PreflightContext) -> Iterator[torch.Tensor | None]:
    """The training loss on the first batch (one forward in train mode, no backward), open
    while the block runs and every state restored after; None when the forward fails or
    the loss is not a differentiable tensor."""
    batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
    with preserved_training_state(ctx):
        ctx.model.train()
        try:
            with ctx.training.plan.autocast():
                loss, _ = split_loss_output(ctx.compute_loss(ctx.model, batch), batch)
        except Exception:
            loss = None
        yield loss if isinstance(loss, torch.Tensor) and loss.requires_grad else None


def receiving_gradient(ctx: PreflightContext, tensors: list[torch.Tensor]) -> list[bool] | None:
    """Which of ``tensors`` the training loss on the first batch reaches (one
    ``autograd.grad``, which leaves every ``.grad`` untouched); None when that cannot be
    told (the loss is not differentiable, or the model refuses ``autograd.grad``, as
    reentrant activation checkpointing does)."""
    with first_batch_loss(ctx) as loss:
        if loss is None:
            return None
        try:
            grads = torch.autograd.grad(loss, tensors, allow_unused=True)
        except Exception:
            return None
    return [grad is not None for grad in grads]


class LossTensorsCheck(Check):
    """O2 outside the model: learnable tensors of the loss that get a gradient in the
    training step, not in any optimizer param group."""

    name = "step.loss_tensors"
    stage = Stage.STEP
    codes = ("O2",)
    requires = (FIRST_BATCH, FIRST_STEP)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        in_optimizer = optimized_ids(ctx.optimizer)
        candidates = [(name, tensor) for name, tensor in loss_tensors(ctx.compute_loss, ctx.model)
                      if id(tensor) not in in_optimizer]
        findings.data["candidates"] = len(candidates)
        if not candidates:
            findings.data["summary"] = "the loss holds no learnable tensor the optimizer leaves out"
            return
        reached = receiving_gradient(ctx, [tensor for _, tensor in candidates])
        if reached is None:
            findings.data["summary"] = "not verified: the loss could not be differentiated on its own"
            return
        stranded = [name for (name, _), hit in zip(candidates, reached) if hit]
        findings.data["stranded"] = len(stranded)
        findings.data["summary"] = f"{len(stranded)} tensor(s) outside the model get a gradient and no update"
        if stranded:
            findings.warning(
                "O2",
                f"{len(stranded)} learnable tensor(s) outside the model get a gradient in the training step but are "
                f"not in any optimizer param group, so they never change: {_names(stranded)}",
                "If they should learn, give them to the optimizer too (e.g. torch.optim.AdamW([*model.parameters(), "
                "*criterion.parameters()]) or a param group of their own); if they are fixed (a frozen loss or "
                "teacher network), call .requires_grad_(False) on them so backward stops computing their gradients.",
            )


def second_forward_leaves(ctx: PreflightContext) -> list[torch.Tensor] | None:
    """``loss_leaves`` of one more training forward on the first batch, or None when it cannot run."""
    known = {id(param) for param in ctx.model.parameters()} | optimized_ids(ctx.optimizer)
    with first_batch_loss(ctx) as loss:
        return None if loss is None else loss_leaves(loss, known)


def _copies_the_batch(tensor: torch.Tensor, batch: list[torch.Tensor]) -> bool:
    """Whether ``tensor`` holds a batch tensor's values, whole or some of its last-dim columns."""
    values = tensor.detach().cpu()
    for leaf in batch:
        leaf = leaf.detach().cpu()
        if leaf.shape == values.shape and torch.equal(leaf, values.to(leaf.dtype)):
            return True
        if leaf.dim() == values.dim() >= 2 and leaf.shape[:-1] == values.shape[:-1] and values.shape[-1] < leaf.shape[-1]:
            width = values.shape[-1]
            if any(torch.equal(leaf[..., start:start + width], values.to(leaf.dtype))
                   for start in range(leaf.shape[-1] - width + 1)):
                return True
    return False


def _shape(tensor: torch.Tensor) -> str:
    return "(" + ", ".join(str(size) for size in tensor.shape) + ("," if tensor.dim() == 1 else "") + ")"


class FreshTensorsCheck(Check):
    """Learnable tensors the forward creates anew at every call (a layer built inside
    ``forward``): the loss reaches them, no optimizer holds them, and a second forward
    reaches different tensors of the same shapes. Each call starts from fresh random
    weights, so that part of the model never learns."""

    name = "step.fresh_tensors"
    stage = Stage.STEP
    codes = ("PARAM_CREATED_IN_FORWARD",)
    requires = (FIRST_BATCH, FIRST_STEP)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        probe = get_probe(ctx)
        first = probe.outside_leaves
        findings.data["outside_leaves"] = len(first)
        if not first:
            findings.data["summary"] = "every learnable tensor the loss reaches is the model's or the optimizer's"
            return
        if probe.trainable_params and len(probe.params_without_grad) == probe.trainable_params:
            findings.data["summary"] = "the loss reaches no model parameter at all: step.gradients explains"
            return
        second = second_forward_leaves(ctx)
        if second is None:
            findings.data["summary"] = "not verified: a second forward could not run"
            return
        before = {id(tensor) for tensor in first}
        shapes = {tuple(tensor.shape) for tensor in first}
        fresh = [tensor for tensor in second if id(tensor) not in before and tuple(tensor.shape) in shapes]
        # An input made differentiable for a derivative with respect to it (a physics-informed
        # loss, a gradient penalty, saliency) is a copy of the batch, not a weight.
        batch = [leaf for leaf in leaves(ctx.artifacts.first_batch) if isinstance(leaf, torch.Tensor)]
        fresh = [tensor for tensor in fresh if not _copies_the_batch(tensor, batch)]
        findings.data["fresh"] = len(fresh)
        findings.data["summary"] = f"{len(fresh)} learnable tensor(s) made anew by each forward"
        if not fresh:
            return
        described = ", ".join(_shape(tensor) for tensor in fresh[:4]) + (" ..." if len(fresh) > 4 else "")
        values = sum(tensor.numel() for tensor in fresh)
        findings.error(
            "PARAM_CREATED_IN_FORWARD",
            f"{len(fresh)} learnable tensor(s) (shapes {described}; {values:,} values) are created anew in every forward: "
            "a layer built inside forward (nn.Linear(...)(h)) or a torch.randn(..., requires_grad=True) there. Each "
            "call starts from new random weights that are not registered in the model and in no optimizer, so they "
            "never train and the output stays random",
            "Build the layer once in __init__ (self.head = nn.Linear(in_features, classes)) and call self.head(h) in "
            "forward (nn.LazyLinear when the input size is known only at the first call); create the optimizer after "
            "the model.",
        )
