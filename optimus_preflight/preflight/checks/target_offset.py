"""Forecast targets that do not follow their own input window (``data.target_offset``).

``TARGETS_NOT_AFTER_WINDOW``: sliding-window samples whose targets are values of the same
series as their inputs, yet start at a different distance past each window
(``analyses/target_offset.py``): a per-lead-time ``(H, N)`` target stack reshaped to
``(N, H)`` instead of transposed, targets sorted or shuffled apart from the windows. Read
from up to 1024 training samples; quiet unless the targets are exactly values of the inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.target_offset import scattered, target_offsets
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

ROWS = 1024
BUDGET_S = 2.0
MAX_FEATURES = 16
MAX_WINDOW = 512  # steps per window: the value index stays small (1024 windows x 512 values)


def _pair(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """((B, W) or (B, W, F) windows, (B, H) targets) of an ``(x, y)`` forecasting batch."""
    if not isinstance(batch, (list, tuple)) or len(batch) != 2:
        return None
    x, y = batch
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x.layout != torch.strided \
            or y.layout != torch.strided or not x.is_floating_point() \
            or not y.is_floating_point() or x.shape[0] != y.shape[0]:
        return None
    if x.dim() not in (2, 3) or not 4 <= x.shape[1] <= MAX_WINDOW or (x.dim() == 3 and x.shape[2] > MAX_FEATURES):
        return None
    if y.dim() == 3 and y.shape[2] == 1:
        y = y[..., 0]
    if y.dim() == 1:
        y = y[:, None]
    if y.dim() != 2:
        return None
    return x.detach().cpu(), y.detach().cpu()


def _target_feature(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The (N, W) windows of the feature whose values hold most of the first targets."""
    if x.dim() == 2:
        return x
    first = y[:, 0]
    shares = [float(torch.isin(first, x[:, :, f]).double().mean()) for f in range(x.shape[2])]
    return x[:, :, max(range(len(shares)), key=shares.__getitem__)]


class TargetOffsetCheck(Check):
    """TARGETS_NOT_AFTER_WINDOW: forecast targets at a different distance past every window."""

    name = "data.target_offset"
    stage = Stage.DATA
    codes = ("TARGETS_NOT_AFTER_WINDOW",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "not (windows, targets) of a series"
        if _pair(ctx.artifacts.first_batch) is None:
            return
        parts = read_samples(ctx, self.name, findings, ctx.train_loader, f"training windows for {self.name}", _pair,
                             ROWS, BUDGET_S)
        if not parts:
            return
        x = torch.cat([p[0] for p in parts])[:ROWS]
        y = torch.cat([p[1] for p in parts])[:ROWS]
        found = target_offsets(_target_feature(x, y), y)
        if found is None:
            findings.data["summary"] = "the targets are not values of the input windows"
            return
        findings.data.update(dated=found.samples, best_lead=found.best_lead, best_share=round(found.best_share, 3),
                             leads=found.leads_seen)
        findings.data["summary"] = (f"{found.best_share:.0%} of {found.samples} dated targets start {found.best_lead} "
                                    "step(s) past their window")
        if not scattered(found):
            return
        findings.warning(
            "TARGETS_NOT_AFTER_WINDOW",
            f"the targets are values of the same series as the input windows, but they do not follow their own "
            f"window: dated by where their values recur in {len(x)} overlapping windows, the first target of "
            f"{found.samples} samples starts at {found.leads_seen} different distances past its window (the most "
            f"common, {found.best_lead} step(s), for only {found.best_share:.0%}). Each window is trained to "
            "forecast another part of the series: a target matrix stacked per lead time as (H, N) and reshaped to "
            "(N, H) instead of transposed (reshape keeps the memory order), or targets sorted, shuffled or filtered "
            "apart from their windows",
            "Build each sample's targets from its own window's end: y[i] = series[i + W : i + W + H] (for an (H, N) "
            "stack per lead time use .T or .permute(1, 0), never .reshape(N, H)); filter and shuffle windows and "
            "targets together.",
        )
