"""Predictions and targets picked out of their full tensors with different selections
(``step.selection_alignment``).

Transductive and masked losses score a subset: the nodes of ``train_idx``, the positions of
a mask. Both sides must be picked with the same selection: ``out[idx]`` against ``y[idx]``.
``out[:n_train]`` against ``y[train_idx]`` (the first nodes against the training nodes'
labels), or ``out[train_mask]`` against ``y[val_mask]``, pairs every prediction with another
sample's label. Shapes agree and nothing raises.

Read from the step: the indexings (``__getitem__``) of a learnable tensor of N rows and of an
integer label tensor of the same N rows, each turned into the list of rows it picks (a slice,
a bool mask, an integer index). Two selections of the same length that pick different rows,
where no other selection of the predictions matches the labels', are reported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import eval_forward_with_grad
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_ROWS = 8


def picked_rows(index: Any, rows: int) -> torch.Tensor | None:
    """The rows of a dimension of ``rows`` an index picks, in order; None for other indexings."""
    if isinstance(index, tuple):
        if not index:
            return None
        if len(index) > 1 and not all(part == slice(None) or part is Ellipsis for part in index[1:]):
            return None
        index = index[0]
    if isinstance(index, slice):
        picked = torch.arange(rows)[index]
        return picked if picked.numel() < rows else None
    if isinstance(index, torch.Tensor) and index.dim() == 1:
        if index.dtype == torch.bool:
            return torch.nonzero(index.cpu()).flatten() if index.numel() == rows else None
        if not index.is_floating_point():
            return index.detach().cpu().long()
    return None


def label_like(tensor: torch.Tensor) -> bool:
    return tensor.dim() == 1 and not tensor.is_floating_point() and tensor.dtype != torch.bool and not tensor.requires_grad


class SelectionWatch(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.predictions: list[tuple[int, torch.Tensor]] = []  # (rows, picked) of learnable tensors
        self.labels: list[tuple[int, torch.Tensor]] = []  # ... of integer label vectors

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "__getitem__" and len(args) >= 2 and isinstance(args[0], torch.Tensor) \
                and args[0].dim() >= 1 and args[0].shape[0] >= MIN_ROWS:
            source, rows = args[0], args[0].shape[0]
            learnable = source.requires_grad and source.is_floating_point()
            if learnable or label_like(source):
                picked = picked_rows(args[1], rows)
                if picked is not None and picked.numel() >= MIN_ROWS // 2:
                    (self.predictions if learnable else self.labels).append((rows, picked))
        return func(*args, **kwargs)


def contiguous(picked: torch.Tensor) -> bool:
    return bool((picked[1:] - picked[:-1] == 1).all())


def mismatch(predictions: list[tuple[int, torch.Tensor]], labels: list[tuple[int, torch.Tensor]]) \
        -> tuple[int, torch.Tensor, torch.Tensor] | None:
    """(rows, the predictions' selection, the labels') when every prediction selection of the
    labels' length picks other rows than the labels' selection (pure). Two slices offset from
    each other are a shifted objective (logits[:-1] against tokens[1:] of one stream), not this."""
    for rows, label_rows in labels:
        same_length = [picked for n, picked in predictions if n == rows and picked.numel() == label_rows.numel()]
        if not same_length or any(torch.equal(picked, label_rows) for picked in same_length):
            continue
        if contiguous(label_rows) and all(contiguous(picked) for picked in same_length):
            continue
        return rows, same_length[0], label_rows
    return None


def describe(picked: torch.Tensor) -> str:
    if torch.equal(picked, torch.arange(int(picked[0]), int(picked[0]) + picked.numel())):
        return f"rows {int(picked[0])}..{int(picked[-1])} (a slice)"
    shown = ", ".join(str(int(i)) for i in picked[:5])
    return f"rows {shown}, ..."


class SelectionAlignmentCheck(Check):
    """PREDICTIONS_TARGETS_SELECTED_APART: out[:n] against y[idx] (or two different masks)."""

    name = "step.selection_alignment"
    stage = Stage.STEP
    codes = ("PREDICTIONS_TARGETS_SELECTED_APART",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        watch = SelectionWatch()
        try:
            with watch:  # gradients on: the model's outputs must be learnable to be told from the labels
                eval_forward_with_grad(ctx)
        except Exception:
            findings.data["summary"] = "the step could not be observed"
            return
        found = mismatch(watch.predictions, watch.labels)
        findings.data["summary"] = (f"{len(watch.predictions)} prediction and {len(watch.labels)} label selection(s)"
                                    if found is None else "predictions and labels selected apart")
        if found is None:
            return
        rows, predicted, labelled = found
        agree = int((predicted == labelled).sum())
        findings.warning(
            "PREDICTIONS_TARGETS_SELECTED_APART",
            f"the loss picks {predicted.numel()} of the {rows} predictions and {labelled.numel()} of the {rows} labels "
            f"with different selections: the predictions' {describe(predicted)} against the labels' "
            f"{describe(labelled)}, the same row in only {agree} of {predicted.numel()} pairs, so every other "
            "prediction is trained against the label of a different sample (node). out[:n_train] against "
            "y[train_idx], or a prediction mask and a label mask from different splits, does this",
            "Select both with the same index: F.cross_entropy(out[train_idx], y[train_idx]) (or out[mask], y[mask]).",
        )

