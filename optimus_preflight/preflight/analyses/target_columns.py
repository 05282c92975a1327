"""Regression targets whose columns live on scales far apart (``TARGET_COLUMN_SCALES``).

One mean-squared error over a (B, K) target weighs each column by its variance: a price in
thousands beside a rate in hundredths leaves the small column a millionth of the loss, so the
shared layers learn only the large one and the small column's head fits its mean. Judged on
the criterion's own target tensor, per column, before any step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from optimus_preflight.preflight.analyses.loss_spy import CriterionCall

MIN_ROWS = 16  # rows before a column's spread says anything
MAX_COLUMNS = 32  # more columns are a signal or an image, not named outputs
MAX_FIELDS = 8  # channels of a field target (pressure, velocities, temperature), not an image's classes
SCALE_RATIO = 30.0  # std of the widest column over the narrowest
CONTINUOUS = 0.25  # share of distinct values a column needs: a rare flag is no narrow scale
SQUARED = ("mse_loss",)
CRITERIA = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")  # distances, weighing columns by their spread


@dataclass
class ColumnScales:
    function: str
    columns: int
    wide: int  # column index of the largest std
    wide_std: float
    narrow: int
    narrow_std: float
    share: float  # the narrow column's share of the loss at a prediction of the column means
    fields: bool = False  # channels of (B, C, ...) fields (pressure beside velocity), not table columns


def column_scales(call: CriterionCall) -> ColumnScales | None:
    """The widest and narrowest column of a (B, K) regression target reduced in one call."""
    target = call.target_tensor
    if call.function not in CRITERIA or target is None or target.dim() < 2 or not target.is_floating_point() \
            or call.reduction == "none" or call.input is None or tuple(call.input.shape) != tuple(target.shape):
        return None
    fields = target.dim() >= 3
    if fields:  # (B, C, ...) fields: each channel's values over the samples and points, a column
        if not 2 <= target.shape[1] <= MAX_FIELDS:
            return None
        target = target.transpose(0, 1).reshape(target.shape[1], -1).T
    rows, columns = target.shape
    if rows < MIN_ROWS or not 2 <= columns <= MAX_COLUMNS:
        return None
    values = target.detach().float()
    if not bool(torch.isfinite(values).all()):
        return None
    stds = values.std(dim=0)
    distinct = torch.tensor([torch.unique(values[:, k]).numel() / rows for k in range(columns)])
    spread = [k for k in range(columns) if float(stds[k]) > 0 and float(distinct[k]) >= CONTINUOUS]
    if len(spread) < 2:
        return None
    wide = max(spread, key=lambda k: float(stds[k]))
    narrow = min(spread, key=lambda k: float(stds[k]))
    ratio = float(stds[wide]) / float(stds[narrow])
    if ratio < SCALE_RATIO:
        return None
    power = 2 if call.function in SQUARED else 1
    weights = stds[spread] ** power
    return ColumnScales(call.function, columns, wide, float(stds[wide]), narrow, float(stds[narrow]),
                        float(stds[narrow] ** power / weights.sum()), fields)


def target_column_scales(calls: list[CriterionCall]) -> ColumnScales | None:
    return next((found for call in calls if (found := column_scales(call)) is not None), None)
