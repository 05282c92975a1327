"""Tabular rows scaled to unit length (``data.row_scaling``).

``ROWS_NORMALIZED``: ``sklearn.preprocessing.normalize(X)`` (and ``F.normalize(x)``) scale each
ROW to unit L2 norm by default: meant for text vectors, whose direction is what counts. On a
table of separate measurements (amounts, counts, sizes) it divides every value by the row's
overall magnitude, which is often the very thing the target depends on (an invoice's fee grows
with its amounts; normalised, a large and a small invoice look the same). Feature scaling
for a table is per column (StandardScaler).

Read from the first training batch: float rows of 5 to 32 non-negative values (measurements,
not signed embeddings, not wide bags of words) whose L2 norms are all 1.
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


class RowScalingCheck(Check):
    """ROWS_NORMALIZED: tabular rows each scaled to unit L2 norm."""

    name = "data.row_scaling"
    stage = Stage.DATA
    codes = ("ROWS_NORMALIZED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        pair = inputs_beside_labels(ctx.artifacts.first_batch)
        inputs = pair[0] if pair is not None else None
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
