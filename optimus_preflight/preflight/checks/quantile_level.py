"""A quantile (pinball) loss that fits another quantile than the one it declares
(``step.quantile_level``).

The pinball loss ``max(q * e, (q - 1) * e)`` with ``e = y - prediction`` is smallest where
the prediction is the q-th quantile of the targets. Written with ``q`` and ``1 - q`` swapped
(``max((1 - q) * e, -q * e)``, or ``e = prediction - y``), it is smallest at the (1 - q)-th:
the P90 head learns P10 and nothing fails.

Measured on the first batch, eval mode: the model's one output per sample replaced by one
constant, set to each quantile of the batch's targets in turn; the loss's minimum over them
is the quantile the loss really fits. Compared with the level the loss function declares
(a closure variable or attribute named ``q``, ``tau``, ``quantile`` or ``alpha``, in (0, 1)).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.declared_fields import declared_fields
from optimus_preflight.preflight.analyses.eval_forward import loss_with_output, model_outputs
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

LEVEL_NAME = re.compile(r"^(q|tau|quantile|quantile_level|alpha|level)$", re.IGNORECASE)
GRID = [round(0.05 * k, 2) for k in range(1, 20)]
OFF_CENTRE = 0.15  # a declared level this far from the median: swapping it moves the fit visibly
TOLERANCE = 0.1  # of the fitted level around 1 - q


def declared_level(loss_fn: Any) -> tuple[str, float] | None:
    """(name, value) of a quantile level the loss function carries, looking one wrapper deep."""
    owners = [loss_fn]
    owners += [value for value in declared_fields(loss_fn).values() if callable(value)]
    for owner in owners:
        for name, value in declared_fields(owner).items():
            if LEVEL_NAME.match(name) and isinstance(value, float) and 0 < value < 1:
                return name, value
    return None


def _targets(batch: Any, rows: int) -> torch.Tensor | None:
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[-1], torch.Tensor):
        return None
    y = batch[-1]
    if not y.is_floating_point() or y.numel() != rows:
        return None
    return y.detach().float().reshape(-1)


def fitted_level(ctx: PreflightContext, batch: Any, y: torch.Tensor) -> float | None:
    """The level p whose target quantile, as the constant prediction for every sample, gives
    the lowest loss; None when the loss does not single one out."""
    losses = []
    for p in GRID:
        value = float(torch.quantile(y, p))
        loss = loss_with_output(ctx, batch, lambda output, value=value: torch.full_like(output, value))
        if loss is None:
            return None
        losses.append(loss)
    best = min(range(len(GRID)), key=losses.__getitem__)
    if 0 < best < len(GRID) - 1 and losses[best] < min(losses[0], losses[-1]):
        return GRID[best]
    return None


class QuantileLevelCheck(Check):
    """QUANTILE_LEVEL_SWAPPED: the loss fits the (1 - q)-th quantile of a declared q."""

    name = "step.quantile_level"
    stage = Stage.STEP
    codes = ("QUANTILE_LEVEL_SWAPPED",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no quantile level declared by the loss function"
        declared = declared_level(ctx.compute_loss)
        if declared is None or abs(declared[1] - 0.5) < OFF_CENTRE:
            return
        name, q = declared
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        outputs = model_outputs(ctx, batch)
        if not outputs or len(outputs) != 1 or not outputs[0].is_floating_point():
            findings.data["summary"] = "not one output per sample"
            return
        y = _targets(batch, outputs[0].numel())
        if y is None or len(y) < 8:
            findings.data["summary"] = "no per-sample float target beside the model's output"
            return
        try:
            fitted = fitted_level(ctx, batch, y)
        except Exception:
            findings.data["summary"] = "the loss could not be computed on constant predictions"
            return
        findings.data.update(declared=q, fitted=fitted)
        findings.data["summary"] = f"{name}={q:g} declared; the loss is lowest at the {fitted} quantile"
        if fitted is None or abs(fitted - (1 - q)) > TOLERANCE or abs(fitted - q) <= TOLERANCE:
            return
        findings.warning(
            "QUANTILE_LEVEL_SWAPPED",
            f"the loss function declares {name}={q:g}, but the loss is lowest when every prediction is the "
            f"{fitted:.2f} quantile of the targets (the first batch's, one constant prediction per trial), near "
            f"1 - {name} = {1 - q:.2f}: the pinball loss is written with {name} and 1 - {name} swapped "
            f"(max((1 - q) * e, -q * e), or the error taken as prediction - y), so the P{round(100 * q)} head is "
            f"trained towards P{round(100 * (1 - q))}",
            "Write the pinball loss with e = y - prediction: torch.maximum(q * e, (q - 1) * e).mean(); check it "
            "with a constant prediction (the loss must be lowest at torch.quantile(y, q)).",
        )
