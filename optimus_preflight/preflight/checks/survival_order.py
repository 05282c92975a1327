"""A Cox partial likelihood whose risk sets run the wrong way (``step.survival_order``).

The Cox loss compares each event's risk with the risk of everyone still at risk then: the
subjects whose time is at least as long. Written over a batch sorted by time with a cumulative
op along it (``logcumsumexp(risk[order], 0)``), the sort must put the longest times first; sorted
ascending, each "risk set" is the subjects who already failed, and the loss rewards the reverse
ranking: long survivors get high risk, the concordance falls below 0.5, and the loss still falls.

Measured on the first batch, eval mode, for a loss that sorts by a batch tensor (the times) and
takes a cumulative op along dim 0: the model's one output per sample replaced by risks that
fall with the time (the right ranking) and by risks that rise with it; a loss lower for the
second ranks the wrong way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.eval_forward import eval_forward, loss_with_output, model_outputs
from optimus_preflight.preflight.checks.batch_order import CumulativeOps
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SPREAD = 2.0  # risks of +-2 standard deviations of the times: a clear ranking, no overflow


def _loss_with_risks(ctx: PreflightContext, batch: Any, risks: torch.Tensor) -> float | None:
    return loss_with_output(ctx, batch, lambda output: risks.to(output.device, output.dtype).reshape(output.shape))


class SurvivalOrderCheck(Check):
    """COX_RISK_SET_REVERSED: the loss prefers risks that rise with the survival time."""

    name = "step.survival_order"
    stage = Stage.STEP
    codes = ("COX_RISK_SET_REVERSED",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no loss that sorts by a batch tensor and accumulates along the batch"
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        watch = CumulativeOps()
        try:
            with watch:
                eval_forward(ctx, batch)
        except Exception:
            return
        if not watch.seen or not watch.keys:
            return
        rows = watch.keys[0].shape[0]
        times = next((leaf.detach().float() for leaf in leaves(batch) if isinstance(leaf, torch.Tensor)
                      and leaf.dim() == 1 and leaf.shape[0] == rows and leaf.is_floating_point()
                      and any(torch.equal(leaf, key) for key in watch.keys)), None)
        outputs = model_outputs(ctx, batch)
        if times is None or not outputs or len(outputs) != 1 or outputs[0].numel() != rows or rows < 8 \
                or float(times.std()) == 0:
            return
        scaled = (times - times.mean()) / times.std()
        try:
            right = _loss_with_risks(ctx, batch, -SPREAD * scaled)
            wrong = _loss_with_risks(ctx, batch, SPREAD * scaled)
        except Exception:
            return
        if right is None or wrong is None:
            return
        findings.data.update(loss_short_lived_risky=right, loss_long_lived_risky=wrong)
        findings.data["summary"] = (f"loss {right:.4g} with risks falling with the time, {wrong:.4g} with risks "
                                    "rising with it")
        if wrong >= right:
            return
        findings.warning(
            "COX_RISK_SET_REVERSED",
            f"the survival loss prefers the reverse ranking: with the model's risks set to fall with the batch's "
            f"times (short survival, high risk) it is {right:.4g}, with risks rising with the times {wrong:.4g}. The "
            "loss sorts the batch by time and accumulates along it; sorted ascending, torch.logcumsumexp gathers for "
            "each event the subjects who already failed instead of those still at risk (time >= its time), so the "
            "risk set is reversed and training ranks long survivors as the riskiest",
            "Sort by time, longest first, before the cumulative op: order = torch.argsort(time, descending=True); "
            "risk, event = risk[order], event[order]; log_risk_set = torch.logcumsumexp(risk, dim=0).",
        )
