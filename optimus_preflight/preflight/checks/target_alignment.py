"""A target broadcast against the wrong axis of a multi-output head (``step.target_alignment``).

A head that predicts several values per target element (Q quantiles per horizon step, K
samples or mixture parts per value) returns ``(B, H, Q)`` against ``(B, H)`` targets; the loss
lines them up with ``y.unsqueeze(-1)``. Written ``y.unsqueeze(1)`` (``(B, 1, H)``), it still
broadcasts when H == Q, and every quantile is scored against another horizon step: nothing
fails, and each output learns a mixture of the wrong targets.

Read from the loss: the model's output replaced by the targets themselves, copied along the
extra axis (every head exactly right). A loss that lines the target up with the output's
leading axes is lowest there (zero for pinball, MSE, L1); one that lines it up with the last
axis is zero instead when the output holds the targets along that axis, and not zero for the
right answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.eval_forward import loss_with_output, model_outputs
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

EXACT = 1e-6  # of the loss at the misaligned answer: zero up to rounding


def target_of(batch: Any, output: torch.Tensor) -> torch.Tensor | None:
    """The batch's float target shaped like the output without its last axis, whose last axis is
    as long as the output's (so a misaligned broadcast runs)."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[-1], torch.Tensor):
        return None
    y = batch[-1]
    if not y.is_floating_point() or y.dim() < 2 or output.dim() != y.dim() + 1 \
            or tuple(output.shape[:-1]) != tuple(y.shape) or output.shape[-1] != y.shape[-1] or y.shape[-1] < 2:
        return None
    return y


class TargetAlignmentCheck(Check):
    """TARGET_AXIS_MISALIGNED: the loss lines a (B, H) target up with a (B, H, Q) output's last axis."""

    name = "step.target_alignment"
    stage = Stage.STEP
    codes = ("TARGET_AXIS_MISALIGNED",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        outputs = model_outputs(ctx, batch)
        output = outputs[0] if outputs and len(outputs) == 1 and outputs[0].is_floating_point() else None
        y = target_of(batch, output) if output is not None else None
        if y is None:
            findings.data["summary"] = "no (B, ..., K) output beside a (B, ..., K) target"
            return
        expected = y.detach().unsqueeze(-1)
        crossed = y.detach().unsqueeze(-2)
        try:
            right = loss_with_output(ctx, batch, lambda out: expected.expand(out.shape).to(out.dtype).clone())
            wrong = loss_with_output(ctx, batch, lambda out: crossed.expand(out.shape).to(out.dtype).clone())
        except Exception:
            findings.data["summary"] = "the loss could not be computed on constructed outputs"
            return
        if right is None or wrong is None:
            findings.data["summary"] = "the loss is not finite on constructed outputs"
            return
        findings.data.update(loss_at_targets=right, loss_at_crossed_targets=wrong)
        findings.data["summary"] = f"loss {right:.4g} with the targets on the leading axes, {wrong:.4g} crossed"
        if not (abs(wrong) <= EXACT * max(1.0, abs(right)) and right > wrong + 1e-3 * max(1.0, abs(right))):
            return
        shape, target = tuple(output.shape), tuple(y.shape)
        findings.warning(
            "TARGET_AXIS_MISALIGNED",
            f"the model returns {shape} beside {target} targets (one target per element of the leading axes, "
            f"{shape[-1]} outputs for each), but the loss broadcasts the target against the output's last axis: with "
            f"the output set to the targets copied along that axis (every head exactly right) the loss is {right:.4g}, "
            f"and with the targets laid along the last axis instead it is {wrong:.4g}. The target is unsqueezed at the "
            "wrong dim (y.unsqueeze(1) giving (B, 1, H) against (B, H, Q)), which still broadcasts because the two "
            f"axes are both {shape[-1]} long, so each quantile or head is scored against another horizon step or "
            "element",
            "Line the target up with the leading axes: e = y.unsqueeze(-1) - pred ((B, H, 1) against (B, H, Q)); "
            "assert e.shape == pred.shape and check with pred = y[..., None].expand_as(pred) that the loss is 0.",
        )
