"""A 0/1 integer tensor used as a mask where it acts as an index (``step.integer_mask``).

``y[mask]`` selects the rows where ``mask`` is True only when ``mask`` is a bool tensor. A
mask of 0/1 integers (``torch.zeros(n, dtype=torch.long)`` filled with 1, a NumPy int array,
``mask.long()`` for a sum, a ``train_mask`` loaded from a file) is read as a list of indices:
``y[mask]`` is ``[y[0], y[1], y[1], y[0], ...]``, rows 0 and 1 repeated, and nothing raises.
A node classifier then trains every output row against the labels of nodes 0 and 1.

Read from the step: an indexing (``__getitem__`` or ``index_select``) with an integer index
tensor whose values are exactly {0, 1}, one per row of the dimension it indexes (a mask's
shape), of a dimension of more than two rows. A real index of 0s and 1s has no reason to be
as long as the rows it indexes into; a lookup into a table of two rows (a binary class
weight, a segment embedding) is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_ROWS = 8


@dataclass
class IntegerMask:
    indexed_shape: tuple[int, ...]
    ones: int
    rows: int


def integer_mask(indexed: object, index: object) -> IntegerMask | None:
    """The 0/1 integer index shaped like a mask over ``indexed``'s first dimension (pure)."""
    if not isinstance(indexed, torch.Tensor) or not isinstance(index, torch.Tensor) or indexed.dim() == 0:
        return None
    if index.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8) or index.dim() != 1:
        return None
    rows = indexed.shape[0]
    if rows <= 2 or rows < MIN_ROWS or index.numel() != rows:
        return None
    values = torch.unique(index)
    if values.numel() != 2 or int(values[0]) != 0 or int(values[1]) != 1:
        return None
    return IntegerMask(tuple(indexed.shape), int(index.sum()), rows)


class IndexWatch(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.found: IntegerMask | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.found is None:
            name = getattr(func, "__name__", "")
            if name == "__getitem__" and len(args) >= 2:
                self.found = integer_mask(args[0], args[1])
            elif name == "index_select" and len(args) >= 3 and args[1] == 0:
                self.found = integer_mask(args[0], args[2])
        return func(*args, **kwargs)


class IntegerMaskCheck(Check):
    """INTEGER_MASK_INDEXES: y[mask] with a 0/1 integer mask gathers rows 0 and 1."""

    name = "step.integer_mask"
    stage = Stage.STEP
    codes = ("INTEGER_MASK_INDEXES",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        watch = IndexWatch()
        try:
            with watch:
                eval_forward(ctx, ctx.artifacts.first_batch)
        except Exception:
            findings.data["summary"] = "the step could not be observed"
            return
        found = watch.found
        if found is None:
            findings.data["summary"] = "no 0/1 integer index shaped like a mask"
            return
        findings.data["summary"] = f"a 0/1 integer index over {found.rows} rows"
        findings.warning(
            "INTEGER_MASK_INDEXES",
            f"the step indexes a {found.indexed_shape} tensor with an integer tensor of 0s and 1s, one per row "
            f"({found.ones} ones of {found.rows}): a mask's shape, but an integer tensor is read as indices, so "
            f"x[mask] is rows 0 and 1 of x repeated {found.rows} times, not the {found.ones} rows where the mask is 1. "
            "A train_mask stored as 0/1 integers (torch.long, a NumPy int array, mask.long()) selects two samples, "
            "and every prediction is trained against their labels",
            "Index with a bool mask: x[mask.bool()] (build masks with dtype=torch.bool, or compare: mask == 1); "
            "keep integer tensors for real index lists (torch.nonzero(mask).squeeze(1)).",
        )
