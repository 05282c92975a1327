"""Tabular rows scaled to unit length (``data.row_scaling``).

``ROWS_NORMALIZED``: ``sklearn.preprocessing.normalize(X)`` (and ``F.normalize(x)``) scale each
ROW to unit L2 norm by default: meant for text vectors, whose direction is what counts. On a
table of separate measurements (amounts, counts, sizes) it divides every value by the row's
overall magnitude, which is often the very thing the target depends on (an invoice's fee grows
with its amounts; normalised, a large and a small invoice look the same). Feature scaling
for a table is per column (StandardScaler).

Read from the first training batch: float rows of 5 to 32 non-negative values (measurements,
not signed embeddings, not wide bags of words) whose L2 norms are all 1.

``ROWS_STANDARDIZED``: ``(X - X.mean(axis=1, keepdims=True)) / X.std(axis=1, keepdims=True)``,
the axis of a column standardisation mistyped: every row then has mean 0 and std 1 across its
own columns. Fired only where the columns collapsed (median std across rows under 0.1), which
is what a table whose columns have different units does; a z-normalised signal per sample (a
time-series convention) keeps its columns' spread and stays quiet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.split_scale import inputs_beside_labels
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_COLUMNS, MAX_COLUMNS, MIN_ROWS = 5, 32, 8
UNIT = 1e-3


def unit_rows(x: torch.Tensor) -> bool:
    """(B, D) non-negative float rows, 5 <= D <= 32, every one of L2 norm 1, not all one-hot (pure)."""
    if x.dim() != 2 or not x.is_floating_point() or not MIN_COLUMNS <= x.shape[1] <= MAX_COLUMNS \
            or len(x) < MIN_ROWS:
        return False
    values = x.detach().double()
    if not bool(torch.isfinite(values).all()) or bool((values < 0).any()):
        return False
    if bool(((values == 0) | (values == 1)).all()):
        return False  # one-hot rows have unit norm by construction
    return bool(((values.norm(dim=1) - 1).abs() < UNIT).all())


COLLAPSED_STD = 0.1  # median column std after the rows were standardised: the columns carry nothing


def rows_standardised(x: torch.Tensor) -> bool:
    """Whether every row of a (B, D) float tensor, 3 <= D, has mean 0 and standard deviation 1
    across its own columns (biased or unbiased): standardised per sample (pure)."""
    if x.dim() != 2 or not x.is_floating_point() or x.shape[1] < 3 or len(x) < MIN_ROWS:
        return False
    values = x.detach().double()
    if not bool(torch.isfinite(values).all()):
        return False
    means, stds = values.mean(1), values.std(1, unbiased=False)
    unit = ((stds - 1).abs() < UNIT) | ((values.std(1) - 1).abs() < UNIT)
    return bool((means.abs() < UNIT).all()) and bool(unit.all())


def standardised_rows(x: torch.Tensor) -> tuple[float, float] | None:
    """(median column std, largest |column mean|) of (B, D) float rows, 3 <= D <= 64, each of
    mean 0 and standard deviation 1 across its own columns, whose columns hardly vary between
    rows any more (median std under 0.1): one large-valued column (an income beside ratios)
    set every row's mean and scale, and the rest collapsed. A per-sample z-normalised signal
    keeps its columns' spread (pure)."""
    if x.dim() != 2 or not x.is_floating_point() or not 3 <= x.shape[1] <= 64 or len(x) < MIN_ROWS:
        return None
    if not rows_standardised(x):
        return None
    values = x.detach().double()
    spread = float(values.std(0).median())
    return (spread, float(values.mean(0).abs().max())) if spread < COLLAPSED_STD else None


class RowScalingCheck(Check):
    """ROWS_NORMALIZED: tabular rows each scaled to unit L2 norm; ROWS_STANDARDIZED: each row
    standardised across its own columns."""

    name = "data.row_scaling"
    stage = Stage.DATA
    codes = ("ROWS_NORMALIZED", "ROWS_STANDARDIZED")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        pair = inputs_beside_labels(ctx.artifacts.first_batch)
        inputs = pair[0] if pair is not None else None
        if isinstance(inputs, torch.Tensor) and (collapsed := standardised_rows(inputs)) is not None:
            spread, largest = collapsed
            findings.data["summary"] = "every row has mean 0 and std 1 across its columns"
            findings.warning(
                "ROWS_STANDARDIZED",
                f"every row of the {tuple(inputs.shape)} training inputs has mean 0 and standard deviation 1 across "
                f"its own columns, and the columns barely vary between samples any more (median column std "
                f"{spread:.2g}, a column mean of {largest:.3g}): the features were standardised per row (mean and "
                "std over axis=1), not per column. On a table of separate measurements the largest-valued column "
                "(an amount, an income) sets each row's mean and scale, so it becomes a near-constant and every "
                "other column is squeezed to almost the same value: the differences between samples are gone",
                "Standardise each column with the training rows' statistics: (X - X_train.mean(axis=0)) / "
                "X_train.std(axis=0) (StandardScaler), and apply the same to validation.",
                "data.train",
            )
            return
        if not isinstance(inputs, torch.Tensor) or not unit_rows(inputs):
            findings.data["summary"] = "no rows of unit length"
            return
        findings.data["summary"] = "every row has unit L2 norm"
        findings.warning(
            "ROWS_NORMALIZED",
            f"every row of the {tuple(inputs.shape)} training inputs has L2 norm 1: the features were scaled per "
            "row, not per column. sklearn.preprocessing.normalize(X) (axis=1 by default) and F.normalize(x) divide "
            "each sample by its own overall magnitude, which suits text vectors whose direction is what counts, "
            "but on a table of separate measurements (amounts, counts, sizes) it erases each sample's scale, often "
            "what the target depends on: a large and a small sample with the same proportions look the same",
            "Scale each column with the training rows' statistics (StandardScaler: (X - X_train.mean(0)) / "
            "X_train.std(0)), and apply the same to validation; keep per-row normalisation for vectors whose "
            "direction alone matters.",
            "data.train",
        )
