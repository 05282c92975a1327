"""A sampled-softmax target that is not the positive's column (``step.sampled_positive``).

``SAMPLED_POSITIVE_NOT_TARGET``: a sampled softmax (next-item recommendation, retrieval with
drawn negatives) scores each row's positive beside K sampled negatives and trains
``cross_entropy(logits, zeros)``: "the positive is class 0". Built as ``cat([neg_scores,
pos_scores])``, the positive sits in the last column, and the loss pushes it down while it
rewards the first negative. Nothing fails; the model learns to rank the true item last.

Measured, not read from the code: with the RNG reseeded before each call (the negatives
repeat), the loss is computed on the first batch and again with one row's positive id (a
1-D integer field of the batch) replaced by another row's. The one column of that row whose
logit moves is where the positive is scored; the constant target must name it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import seeded_eval_forward
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import batch_size_of, leaves, map_batch

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SEED = 1234
PROBED_ROWS = (0, 1, 2)
MOVED = 1e-6  # of the logits' largest magnitude


class ConstantTargetWatch(TorchFunctionMode):
    """The first cross-entropy over (B, W) logits whose target is one class for every row."""

    def __init__(self) -> None:
        super().__init__()
        self.logits: torch.Tensor | None = None
        self.column: int | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is F.cross_entropy and self.logits is None and len(args) >= 2:
            logits, target = args[0], args[1]
            if isinstance(logits, torch.Tensor) and isinstance(target, torch.Tensor) and logits.dim() == 2 \
                    and logits.shape[1] >= 2 and target.dim() == 1 and not target.is_floating_point() \
                    and target.numel() == logits.shape[0] >= 2 and bool((target == target[0]).all()):
                self.logits, self.column = logits.detach().float().cpu().clone(), int(target[0])
        return out


def _observe(ctx: PreflightContext, batch: Any) -> ConstantTargetWatch:
    watch = ConstantTargetWatch()
    with watch:
        seeded_eval_forward(ctx, batch, SEED)
    return watch


def _with_row_replaced(batch: Any, field: torch.Tensor, row: int) -> Any | None:
    other = next((int(v) for v in field.tolist() if int(v) != int(field[row])), None)
    if other is None:
        return None
    changed = field.clone()
    changed[row] = other
    return map_batch(lambda value: changed if value is field else value, batch)


def _moved_columns(before: torch.Tensor, after: torch.Tensor, row: int) -> tuple[list[int], bool]:
    """(the columns of ``row`` that moved, whether any other row moved)."""
    scale = float(before.abs().max().clamp_min(1e-12))
    moved = (after - before).abs() > MOVED * scale
    others = bool(torch.cat([moved[:row], moved[row + 1:]]).any())
    return torch.nonzero(moved[row]).flatten().tolist(), others


class SampledPositiveCheck(Check):
    """SAMPLED_POSITIVE_NOT_TARGET: a constant class target that is not where the positive is scored."""

    name = "step.sampled_positive"
    stage = Stage.STEP
    codes = ("SAMPLED_POSITIVE_NOT_TARGET",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no cross-entropy with one target class for every row"
        batch = ctx.artifacts.first_batch
        rows = batch_size_of(batch)
        try:
            base = _observe(ctx, batch)
        except Exception:
            return
        if base.logits is None or base.logits.shape[0] != rows:
            return
        ids = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.dim() == 1
               and leaf.shape[0] == rows and not leaf.is_floating_point() and leaf.dtype != torch.bool
               and leaf.layout == torch.strided and int(leaf.unique().numel()) > 1]
        for field in ids:
            columns: set[int] = set()
            for row in PROBED_ROWS[: max(0, rows)]:
                changed = _with_row_replaced(batch, field, row)
                if changed is None:
                    break
                try:
                    after = _observe(ctx, changed)
                except Exception:
                    return
                if after.logits is None or after.logits.shape != base.logits.shape:
                    break
                moved, others = _moved_columns(base.logits, after.logits, row)
                if others or len(moved) != 1:
                    break
                columns.add(moved[0])
            else:
                if len(columns) != 1:
                    continue
                column = columns.pop()
                findings.data.update(positive_column=column, target_column=base.column)
                findings.data["summary"] = f"the positive is scored in column {column}, the target is {base.column}"
                if column == base.column:
                    return
                width = base.logits.shape[1]
                findings.warning(
                    "SAMPLED_POSITIVE_NOT_TARGET",
                    f"the loss's cross_entropy over ({rows}, {width}) sampled logits targets column {base.column} for "
                    f"every row, but each row's positive (the batch's id, changed for a probed row, moves only column "
                    f"{column} of that row) is scored in column {column}: the loss rewards a sampled negative and "
                    f"pushes the true item down. The logits were built as torch.cat([neg_scores, pos_scores], 1) with "
                    "the positive last while the target says 'the positive is class 0'",
                    f"Put the positive where the target points: logits = torch.cat([pos_scores, neg_scores], 1) with "
                    f"targets torch.zeros(B, dtype=torch.long), or keep the order and use targets torch.full((B,), "
                    f"{column}).",
                )
                return
