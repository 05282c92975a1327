"""Gaps of a series filled with a constant the signal never takes (``data.series_fill``).

``SERIES_GAP_FILLED``: ``(B, T)`` or ``(B, T, F)`` windows of a smooth series in which one
exact value makes up 2% or more of the entries, lies outside the other values, and is
reached in a jump ten times the series' ordinary step (``analyses/gap_fill.py``): missing
readings filled with 0 (``fillna(0)``, ``nan_to_num``) or a sentinel, fed to the model as
if measured, and into the targets cut from the same series.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.analyses.gap_fill import gap_fill
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SMOOTH = 0.5  # lag-one autocorrelation of the windows, the fill values left out
MAX_FEATURES = 64


def _series_of(tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """(label, (B, T) windows) of a float batch field shaped like windows of series."""
    if tensor.layout != torch.strided or not tensor.is_floating_point() or tensor.dim() not in (2, 3) \
            or tensor.shape[1] < 8:
        return []
    if tensor.dim() == 2:
        return [("", tensor)]
    if tensor.shape[2] > MAX_FEATURES:
        return []
    return [(f" feature {f}", tensor[:, :, f]) for f in range(tensor.shape[2])]


def lag_one_between_readings(windows: torch.Tensor, fill: float) -> float:
    """The lag-1 autocorrelation of (B, T) windows over the pairs of consecutive entries that are
    both real readings (neither is ``fill``), each window centred on the mean of its readings:
    a constant written into 40% of the entries would otherwise read as the signal's own steps."""
    x = windows.detach().double()
    real = x != fill
    centred = torch.where(real, x - torch.where(real, x, torch.nan).nanmean(1, keepdim=True), torch.zeros_like(x))
    centred = torch.nan_to_num(centred)  # a window of fills only
    pairs = real[:, 1:] & real[:, :-1]
    if int(pairs.sum()) == 0:
        return 0.0
    numerator = (centred[:, 1:] * centred[:, :-1] * pairs).sum() / pairs.sum()
    denominator = (centred * centred * real).sum() / real.sum().clamp_min(1)
    return float(numerator / denominator.clamp_min(1e-30))


class SeriesFillCheck(Check):
    """SERIES_GAP_FILLED: a constant written into the gaps of a series' windows."""

    name = "data.series_fill"
    stage = Stage.DATA
    codes = ("SERIES_GAP_FILLED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no series window holds a fill value"
        fields = [leaf for leaf in leaves(ctx.artifacts.first_batch) if isinstance(leaf, torch.Tensor)]
        for index, field in enumerate(fields):
            for label, windows in _series_of(field.detach().cpu()):
                found = gap_fill(windows)
                if found is None:
                    continue
                if lag_one_between_readings(windows, found.value) < SMOOTH:
                    continue
                targets = [i for i, other in enumerate(fields) if i != index and other.is_floating_point()
                           and bool((other == found.value).any())]
                also = (f"; batch field {targets[0]} (the targets) holds it too, so the model is also trained to "
                        "forecast the fill value" if targets else "")
                findings.data.update(field=index, value=found.value, share=round(found.share, 4))
                findings.data["summary"] = f"field {index}{label}: {found.share:.0%} of the entries are {found.value:g}"
                findings.warning(
                    "SERIES_GAP_FILLED",
                    f"batch field {index}{label} is windows of a series around {found.typical:.4g} in which the exact "
                    f"value {found.value:g} makes up {found.share:.0%} of the entries, outside every other value and "
                    f"reached in jumps {found.jump:.0f}x the series' ordinary step: missing readings filled with a "
                    f"constant (fillna({found.value:g}), nan_to_num) and fed to the model as if measured{also}. The "
                    "model learns sudden drops to that value and its forecasts are dragged towards it",
                    "Fill gaps from the series itself (forward fill, df.interpolate(limit=...)) and add a 0/1 'was "
                    "missing' input channel, or drop the windows (and targets) that contain gaps; never write a "
                    "constant the signal does not take into inputs or targets.",
                )
                return
