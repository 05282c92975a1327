"""A feature column that gives the label away in training only (``data.train_only_column``).

``TRAIN_ONLY_FEATURE``: a tabular column that separates the training labels (AUC 0.85+, or
a Spearman correlation of 0.8+ with a continuous label) and does so far less on the
validation rows (``analyses/column_shortcut.py``): a target encoding computed with each
row's own label, a feature filled from the label in training only. The model leans on it
and validation, built without the leak, pays. Read from up to 1024 rows of each split.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.column_shortcut import train_only_column
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.feature_leak import _labels_of
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

ROWS = 1024
BUDGET_S = 2.0


def _table(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    pair = _labels_of(batch)
    if pair is None or pair[0].dim() != 2 or pair[0].layout != torch.strided or pair[1].layout != torch.strided:
        return None
    return pair[0].detach().cpu(), pair[1].detach().cpu()


class TrainOnlyColumnCheck(Check):
    """TRAIN_ONLY_FEATURE: a column that predicts the label in training and far less in validation."""

    name = "data.train_only_column"
    stage = Stage.DATA
    codes = ("TRAIN_ONLY_FEATURE",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if _table(ctx.artifacts.first_batch) is None or ctx.val_loader is None:
            findings.data["summary"] = "not a (features, labels) table with a validation loader"
            return
        splits = []
        for loader, which in ((ctx.train_loader, "training"), (ctx.val_loader, "validation")):
            parts = read_samples(ctx, self.name, findings, loader, f"{which} rows for {self.name}", _table, ROWS, BUDGET_S)
            if not parts:
                return
            splits.append((torch.cat([p[0] for p in parts])[:ROWS], torch.cat([p[1] for p in parts])[:ROWS]))
        (train_x, train_y), (val_x, val_y) = splits
        found = train_only_column(train_x, train_y, val_x, val_y)
        findings.data["summary"] = f"{train_x.shape[1]} columns over {len(train_y)} training and {len(val_y)} validation rows"
        if found is None:
            return
        findings.data.update(column=found.column, measure=found.measure, train=round(found.train, 3),
                             val=round(found.val, 3))
        findings.warning(
            "TRAIN_ONLY_FEATURE",
            f"feature column {found.column} predicts the label in training ({found.measure} {found.train:.2f} over "
            f"{len(train_y)} rows) and far less in validation ({found.val:.2f} over {len(val_y)} rows): the column "
            "was computed with the training labels, a leak the model learns instead of the task. A target (mean) "
            "encoding of a category over the whole training table includes each row's own label (with few rows per "
            "category it nearly is the label); a feature imputed or filled from the label, or known only in "
            "hindsight, does the same",
            "Compute the column without the row's own label: a target encoding out of fold (K-fold, or leave-one-out "
            "(group_sum - y) / (group_count - 1)) for training rows and from the training split only for validation "
            "rows; drop features derived from the label or from the future.",
        )
