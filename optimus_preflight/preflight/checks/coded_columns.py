"""Category codes fed to the network as numbers (``data.coded_columns``).

``CATEGORY_CODES_AS_NUMBERS``: a tabular column that holds label-encoded categories (a city,
a product or a zip-code index) reaches the first linear layer as one float, so the network
reads code 17 as lying between codes 16 and 18 and must carve a jagged function of it to
tell the categories apart. Read from up to 2048 training rows (``analyses.coded_columns``):
a column of 6 to 200 levels whose per-level mean target differs strongly (F of 8 or more)
while neighbouring levels' means are unrelated (lag-1 correlation at most 0.2). Ordered
quantities (ages, counts, ratings, binned values) have neighbouring levels alike and stay
quiet, as do one-hot columns (two levels) and continuous columns (more than 200).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.analyses.coded_columns import MAX_COLUMNS, CodedColumn, coded_columns
from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.split_scale import inputs_beside_labels
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SAMPLES = 2048
BUDGET_S = 2.0
MAX_CLASSES = 20


def _table(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rows (B, D) float, targets (B,)) of a tabular (x, y) batch."""
    pair = inputs_beside_labels(batch)
    if pair is None:
        return None
    x, y = pair
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or not x.is_floating_point() \
            or x.dim() != 2 or x.shape[1] > MAX_COLUMNS or y.numel() != len(x) or y.dtype == torch.bool:
        return None
    return x.detach().float().cpu(), y.detach().reshape(-1).cpu()


def _strongest(features: torch.Tensor, labels: torch.Tensor) -> list[CodedColumn]:
    if labels.is_floating_point() and int(torch.unique(labels).numel()) > MAX_CLASSES:
        return coded_columns(features, labels)
    classes = torch.unique(labels)
    if len(classes) > MAX_CLASSES:
        return []
    found: dict[int, CodedColumn] = {}
    for value in classes[1:] if len(classes) == 2 else classes:
        for column in coded_columns(features, (labels == value).double()):
            if column.column not in found or column.f_statistic > found[column.column].f_statistic:
                found[column.column] = column
    return sorted(found.values(), key=lambda c: -c.f_statistic)


def _embedded_columns(ctx: PreflightContext) -> set[int]:
    """Columns of the first batch's rows that the model looks up in an nn.Embedding (cast to
    long in forward): categories already, not numbers."""
    table = _table(ctx.artifacts.first_batch)
    if table is None:
        return set()
    rows = table[0]
    ids: list[torch.Tensor] = []

    def seen(module: nn.Module, args: tuple) -> None:
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() == 1 and not args[0].is_floating_point():
            ids.append(args[0].detach().cpu())

    handles = [m.register_forward_pre_hook(seen) for m in ctx.model.modules() if isinstance(m, nn.Embedding)]
    if not handles:
        return set()
    try:
        eval_forward(ctx, ctx.artifacts.first_batch)
    except Exception:
        return set()
    finally:
        for handle in handles:
            handle.remove()
    return {column for column in range(rows.shape[1]) for looked_up in ids
            if looked_up.shape[0] == rows.shape[0] and torch.equal(looked_up, rows[:, column].cpu().long())}


class CodedColumnsCheck(Check):
    """CATEGORY_CODES_AS_NUMBERS: label-encoded categories in a float feature column."""

    name = "data.coded_columns"
    stage = Stage.DATA
    codes = ("CATEGORY_CODES_AS_NUMBERS",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "not a tabular (rows, targets) batch"
        if _table(ctx.artifacts.first_batch) is None:
            return
        parts = read_samples(ctx, self.name, findings, ctx.train_loader, f"training rows for {self.name}", _table,
                             SAMPLES, BUDGET_S)
        if not parts or len({x.shape[1] for x, _ in parts}) != 1:
            return
        features, labels = torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])
        found = _strongest(features, labels)
        findings.data["summary"] = f"{len(found)} column(s) of category codes"
        findings.data["coded_columns"] = [{"column": c.column, "levels": c.levels, "f": round(c.f_statistic, 1),
                                           "neighbours": round(c.neighbour_correlation, 3)} for c in found]
        found = [c for c in found if c.column not in _embedded_columns(ctx)]
        if not found:
            return
        first = found[0]
        shown = ", ".join(f"{c.column} ({c.levels} levels)" for c in found[:4])
        findings.warning(
            "CATEGORY_CODES_AS_NUMBERS",
            f"feature column(s) {shown} hold category codes fed to the network as numbers: column {first.column}'s "
            f"{first.levels} distinct values each shift the target strongly (F = {first.f_statistic:.0f}) but "
            f"neighbouring values have unrelated effects (correlation {first.neighbour_correlation:+.2f} between "
            "adjacent levels, where an age, a count or a rating changes smoothly). A label-encoded category "
            "(LabelEncoder, .cat.codes, an id) makes code 17 read as between codes 16 and 18, so the first layer "
            "needs a jagged function of one number to tell the categories apart and learns them badly",
            "Encode the column as a category: one-hot (pd.get_dummies / OneHotEncoder fitted on the training split) "
            "for a few levels, or pass the codes as a long tensor to an nn.Embedding(levels, dim) and concatenate "
            "the embedding with the numeric columns.",
            "data.train",
        )
