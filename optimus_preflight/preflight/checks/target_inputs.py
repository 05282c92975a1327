"""The regression targets fed to the model they train (``step.target_inputs``).

A teacher-forced decoder reads the previous step's true value: its input is the target
sequence shifted right by one (the last observed value first, ``y[:, :-1]`` after it). Fed
``y`` itself, each decoder step reads the very value it must predict: the loss falls by
copying, and autoregressive decoding at inference, which has no target to read, fails. The
token-level twin (a language model's labels unshifted) is ``step.target_leak``.

Read from the step: the batch's float targets ``(B, H)`` (``H >= 2``, not 0/1 codes, and not a
copy of an input of the batch: an autoencoder reconstructs its input on purpose), and every
tensor a submodule of the model receives in one eval-mode ``compute_loss`` with autograd on;
one that holds exactly the targets, position for position, is the finding when the loss also
compares the targets themselves with something the model computed (an op outside every module
that takes them beside a tensor in the graph). A second view or a pair's other element is fed
to the model too, but the loss only compares the model's outputs with each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.analyses.eval_forward import eval_forward_with_grad
from optimus_preflight.preflight.analyses.loss_ops import watched_loss_ops
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_ROWS = 4


def sequence_targets(batch: Any) -> torch.Tensor | None:
    """The batch's last element when it is a (B, H >= 2) float target of varying, non-0/1 values
    that no other element of the batch equals."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[-1], torch.Tensor):
        return None
    y = batch[-1]
    if y.dim() == 3 and y.shape[2] == 1:
        y = y[..., 0]
    if not y.is_floating_point() or y.dim() != 2 or y.shape[1] < 2 or len(y) < MIN_ROWS \
            or bool(((y == 0) | (y == 1)).all()) or bool((y == y.flatten()[0]).all()):
        return None
    for other in batch[:-1]:
        if isinstance(other, torch.Tensor) and other.numel() == y.numel() and torch.equal(
                other.detach().reshape(y.shape).to(y.dtype), y):
            return None
    return y


def holds_targets(given: list[torch.Tensor], target: torch.Tensor) -> bool:
    """The batch's target tensor itself (or an equal copy outside the graph) among ``given``."""
    return any(leaf is target or (leaf.shape == target.shape and not leaf.requires_grad and torch.equal(leaf, target))
               for leaf in given)


class TargetInputsCheck(Check):
    """TARGETS_FED_TO_MODEL: a submodule reads the regression targets themselves."""

    name = "step.target_inputs"
    stage = Stage.STEP
    codes = ("TARGETS_FED_TO_MODEL",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        y = sequence_targets(batch)
        if y is None:
            findings.data["summary"] = "no (B, H) float sequence targets"
            return
        target = y.detach()
        readers: list[str] = []
        names = {module: name for name, module in ctx.model.named_modules() if name}
        as_input: list[bool] = []  # the model itself called on the targets: they are an input here
        compared: list[bool] = []  # the loss scores something the model computed against the targets

        def watch(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if module is ctx.model:
                first = next((leaf for leaf in leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)), None)
                as_input.append(first is not None and first.shape[:2] == target.shape[:2]
                                and first.numel() == target.numel() and torch.equal(first.detach().reshape(
                                    target.shape).to(target.dtype), target))
                return
            for leaf in leaves((args, kwargs)):
                if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.numel() == target.numel() \
                        and leaf.shape[:2] == target.shape and torch.equal(leaf.detach().reshape(target.shape), target):
                    readers.append(names[module])
                    return

        def compare(given: list[torch.Tensor]) -> None:
            if not compared and holds_targets(given, batch[-1]):
                compared.append(True)

        try:
            with watched_loss_ops(ctx.model, compare, on_module=watch):
                eval_forward_with_grad(ctx)
        except Exception:
            findings.data["summary"] = "the step could not be observed"
            return
        if any(as_input):
            findings.data["summary"] = "the model is called on the last batch element: an input, not targets"
            return
        if not compared:
            findings.data["summary"] = "the loss never compares the targets with the model's output"
            return
        findings.data["summary"] = f"{len(readers)} submodule(s) read the targets"
        if not readers:
            return
        rows, steps = target.shape
        findings.warning(
            "TARGETS_FED_TO_MODEL",
            f"the model's {readers[0]} receives the batch's ({rows}, {steps}) regression targets themselves, value for "
            "value, during the loss: the decoder is teacher-forced with the target sequence y instead of y shifted "
            "right by one step, so each step reads the very value it must predict and learns to copy it (the loss "
            "falls fast), while autoregressive decoding at inference, which has no target to read, fails",
            "Shift the teacher-forcing input right by one: dec_in = torch.cat([x[:, -1:], y[:, :-1]], dim=1) (the last "
            "observed value, then the targets up to the previous step); never pass y itself to the model.",
        )
