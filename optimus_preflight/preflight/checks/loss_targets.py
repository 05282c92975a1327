"""Targets normalised by their own statistics inside the loss (``step.loss_targets``).

Per-window normalisation of a forecaster puts the horizon on the input window's scale:
``(y - mu_x) / sd_x``, with the window's mean and std, which inference can invert. Written with
the target's own statistics, ``(y - y.mean(1)) / y.std(1)``, every target row comes out at mean 0
and std 1: its level and scale are gone, and nothing at inference can put a forecast back on a
scale that was computed from the unknown future itself. The data-side twin (targets normalised
in ``__getitem__``) is ``data.sample_standardised``.

Read from the step: the tensors the loss compares with the model's output (an op outside every
module that takes one tensor in the graph and one that is not), when one of them has one row per
sample of 3 or more values and every row sits at mean 0 and std 1 while the batch's own targets
do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.eval_forward import eval_forward_with_grad
from optimus_preflight.preflight.analyses.loss_ops import watched_loss_ops
from optimus_preflight.preflight.checks.sample_standardised import targets_normalised_per_sample
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


CENTRED = 1e-4  # a row's mean, of the tensor's largest value: zero up to rounding
UNIT_STD = 0.05  # a row's std within this of 1 (a std + eps in the denominator shrinks it a little)
ROWS = 0.9  # share of the rows: a flat row (std near 0) stays far from 1 whatever the eps
MAX_KEPT = 8  # compared tensors kept


def rows_standardised(tensor: torch.Tensor) -> bool:
    """Every row centred on 0 and most rows at std 1 (population or sample): each row scaled by
    its own statistics (pure)."""
    rows = tensor.detach().double()
    if rows.dim() != 2 or rows.shape[1] < 3 or len(rows) < 4:
        return False
    scale = max(1.0, float(rows.abs().max()))
    if not bool((rows.mean(1).abs() <= CENTRED * scale).all()):
        return False
    near_one = [float(((rows.std(1, unbiased=unbiased) - 1).abs() <= UNIT_STD).double().mean()) for unbiased in (True, False)]
    return max(near_one) >= ROWS


class LossTargetsCheck(Check):
    """TARGETS_NORMALISED_IN_LOSS: the loss scores predictions against targets at each row's own mean 0, std 1."""

    name = "step.loss_targets"
    stage = Stage.STEP
    codes = ("TARGETS_NORMALISED_IN_LOSS",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch: Any = ctx.artifacts.first_batch
        y = batch[-1] if isinstance(batch, (list, tuple)) and len(batch) >= 2 else None
        if not isinstance(y, torch.Tensor) or not y.is_floating_point() or y.dim() != 2 or y.shape[1] < 3 \
                or targets_normalised_per_sample(y) is not None:
            findings.data["summary"] = "no (B, H) float targets on their own scale"
            return
        found: list[torch.Tensor] = []  # tensors outside the graph the loss combines with one in it

        def compared(given: list[torch.Tensor]) -> None:
            if len(found) < MAX_KEPT:
                found.extend(leaf.detach() for leaf in given if not leaf.requires_grad and leaf.dim() == 2
                             and leaf.shape[0] == len(y) and leaf.shape[1] >= 3 and leaf.is_floating_point())

        try:
            with watched_loss_ops(ctx.model, compared):
                eval_forward_with_grad(ctx)
        except Exception:
            findings.data["summary"] = "the loss could not be observed"
            return
        findings.data["summary"] = f"{len(found)} tensor(s) compared with the model's output"
        if not any(rows_standardised(tensor) for tensor in found) or rows_standardised(y):
            return
        how = "standardised with its own mean and std"
        findings.warning(
            "TARGETS_NORMALISED_IN_LOSS",
            f"the loss compares the model's output with a ({len(y)}, {y.shape[1]}) tensor whose every row is {how}, "
            "while the batch's targets are not: the targets are normalised inside the loss by their own statistics "
            "((y - y.mean(1)) / y.std(1)), not by the input window's. Each target row loses its level and scale, "
            "and a forecast can never be put back on the series' scale, since the statistics came from the unknown "
            "future itself",
            "Normalise the targets with the input window's statistics: mu, sd = x.mean(1, keepdim=True), "
            "x.std(1, keepdim=True) + eps; loss = mse(model((x - mu) / sd), (y - mu) / sd); forecast = out * sd + mu.",
        )
