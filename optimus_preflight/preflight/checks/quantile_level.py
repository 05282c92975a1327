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
A head of Q quantiles ((B, Q) outputs against one target per sample) is measured one column
at a time (the others held at the median) against the Q levels the loss or the model carries
(a tensor, list or tuple named like ``taus``, ``quantiles`` or ``levels``).
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
LEVELS_NAME = re.compile(r"^_?(qs|taus?|quantiles?|quantile_levels|levels|alphas|q_levels)$", re.IGNORECASE)
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


def level_values(value: Any, count: int | None) -> list[float] | None:
    """Two or more quantile levels in (0, 1) (``count`` of them when given)."""
    if isinstance(value, torch.Tensor) and value.dim() == 1 and value.is_floating_point():
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or len(value) < 2 or count is not None and len(value) != count or \
            not all(isinstance(v, float) and 0 < v < 1 for v in value):
        return None
    return [round(v, 4) for v in value]


def named_globals(owner: Any) -> list[tuple[str, Any]]:
    """The module-level names a function's code reads (QS = torch.tensor([0.1, 0.5, 0.9]) above
    the loss), of any type."""
    code, scope = getattr(owner, "__code__", None), getattr(owner, "__globals__", {})
    return [(name, scope[name]) for name in (code.co_names if code is not None else ()) if name in scope]


def declared_levels(loss_fn: Any, model: Any, count: int | None = None) -> tuple[str, list[float]] | None:
    """(name, levels) of the quantile levels (``count`` of them when given) the loss function
    (one wrapper deep) or the model carries."""
    owners = [loss_fn] + [value for value in declared_fields(loss_fn).values() if callable(value)] + [model]
    for owner in owners:
        for name, value in [*declared_fields(owner).items(), *named_globals(owner)]:
            levels = level_values(value, count) if LEVELS_NAME.match(name) else None
            if levels is not None:
                return name, levels
    return None


def _targets(batch: Any, rows: int) -> torch.Tensor | None:
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[-1], torch.Tensor):
        return None
    y = batch[-1]
    if not y.is_floating_point() or y.numel() != rows:
        return None
    return y.detach().float().reshape(-1)


def constant_column(output: torch.Tensor, column: int | None, value: float, rest: float) -> torch.Tensor:
    """The output filled with ``rest``, its ``column`` (every value when None) with ``value``."""
    if column is None:
        return torch.full_like(output, value)
    filled = torch.full_like(output, rest)
    filled[:, column] = value
    return filled


def fitted_level(ctx: PreflightContext, batch: Any, y: torch.Tensor, column: int | None = None) -> float | None:
    """The level p whose target quantile, as the constant prediction for every sample (in one
    column of a (B, Q) head, the others at the median), gives the lowest loss; None when the
    loss does not single one out."""
    losses = []
    median = float(torch.quantile(y, 0.5))
    for p in GRID:
        value = float(torch.quantile(y, p))
        loss = loss_with_output(ctx, batch, lambda output, value=value: constant_column(output, column, value, median))
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
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        declared = declared_level(ctx.compute_loss)
        if declared is not None and abs(declared[1] - 0.5) < OFF_CENTRE:
            return
        if declared is None and declared_levels(ctx.compute_loss, ctx.model) is None:
            return
        outputs = model_outputs(ctx, batch)
        head = outputs[0] if outputs and len(outputs) == 1 and outputs[0].is_floating_point() else None
        if head is not None and head.dim() == 2 and head.shape[1] > 1:
            self.judge_head(ctx, findings, batch, head)
            return
        if declared is None:
            return
        name, q = declared
        if head is None:
            findings.data["summary"] = "not one output per sample"
            return
        y = _targets(batch, head.numel())
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

    def judge_head(self, ctx: PreflightContext, findings: Findings, batch: Any, head: torch.Tensor) -> None:
        """A (B, Q) head of quantiles: each off-centre column's fitted level against its declared one."""
        declared = declared_levels(ctx.compute_loss, ctx.model, head.shape[1])
        y = _targets(batch, head.shape[0])
        if declared is None or y is None or len(y) < 8:
            findings.data["summary"] = "no quantile levels declared for the model's output columns"
            return
        name, levels = declared
        swapped = []
        try:
            for column, q in enumerate(levels):
                if abs(q - 0.5) < OFF_CENTRE:
                    continue
                fitted = fitted_level(ctx, batch, y, column)
                if fitted is not None and abs(fitted - (1 - q)) <= TOLERANCE < abs(fitted - q):
                    swapped.append((column, q, fitted))
        except Exception:
            findings.data["summary"] = "the loss could not be computed on constant predictions"
            return
        findings.data["summary"] = f"{name}={levels} declared; {len(swapped)} column(s) fit the swapped level"
        if not swapped:
            return
        shown = ", ".join(f"column {column} ({name}[{column}]={q:g}) at the {fitted:.2f} quantile" for column, q, fitted in swapped)
        findings.warning(
            "QUANTILE_LEVEL_SWAPPED",
            f"the model's {head.shape[1]} output columns are the quantile levels {name}={levels}, but the loss is "
            f"lowest with each column set to the (1 - q)-th quantile of the targets, not the q-th: {shown} (the "
            "first batch's, one column at a time as a constant prediction, the others at the median). The pinball "
            "loss is written with q and 1 - q swapped (the error taken as prediction - y, or max((1 - q) * e, -q * "
            "e)), so the high quantile heads learn the low quantiles and the interval comes out inverted",
            "Write the pinball loss with e = y - prediction: torch.maximum(q * e, (q - 1) * e).mean() with q the "
            "(Q,) levels broadcast over the (B, Q) predictions and e = y[:, None] - pred; check it with a constant "
            "prediction (column j's loss must be lowest at torch.quantile(y, q[j])).",
        )
