"""A constant written into the gaps of a series: ``fillna(0)`` on a signal that lives far from 0.

Sensor dropouts filled with 0 (or -1, -999) in a temperature around 20 degrees put a value
the signal never takes into the inputs, and into the targets cut from the same series: the
model learns sudden drops to the fill value and its forecasts are dragged towards it.
A series whose real values include that constant (counts with zeros, a signal crossing 0)
reaches it from nearby values; a fill value sits far outside the rest and is reached in one
jump many times the series' ordinary step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_SHARE = 0.02  # of the entries, exactly this one value
MIN_ENTRIES = 8
JUMP = 10.0  # the step into the value, over the median step between other neighbours
OUTSIDE_QUANTILE = 0.01  # the value lies below this quantile of the other values (or above 1 - it)


@dataclass(frozen=True)
class GapFill:
    value: float
    share: float
    jump: float  # median |step| into the value over the median ordinary |step|
    typical: float  # median of the other values


def gap_fill(windows: torch.Tensor) -> GapFill | None:
    """The fill value of ``(B, T)`` windows of a series (time along the last axis), or None."""
    if windows.dim() != 2 or windows.shape[1] < 4 or not windows.is_floating_point():
        return None
    x = windows.detach().double().cpu()
    values, counts = torch.unique(x, return_counts=True)
    top = int(counts.argmax())
    value, count = float(values[top]), int(counts[top])
    if count < max(MIN_ENTRIES, MIN_SHARE * x.numel()) or count == x.numel():
        return None
    filled = x == value
    others = x[~filled]
    low, high = torch.quantile(others, torch.tensor([OUTSIDE_QUANTILE, 1 - OUTSIDE_QUANTILE], dtype=torch.float64))
    if low <= value <= high:
        return None
    left, right = x[:, :-1], x[:, 1:]
    ordinary = (~filled[:, :-1]) & (~filled[:, 1:])
    into = filled[:, :-1] ^ filled[:, 1:]  # one side the value, the other a real reading
    if int(ordinary.sum()) < MIN_ENTRIES or int(into.sum()) < MIN_ENTRIES // 2:
        return None
    step = float((right - left)[ordinary].abs().median())
    jump = float((right - left)[into].abs().median())
    if step <= 0 or jump < JUMP * step:
        return None
    return GapFill(value, count / x.numel(), jump / step, float(others.median()))
