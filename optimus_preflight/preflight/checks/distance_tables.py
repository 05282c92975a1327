"""A per-triplet loss written on tables of every pair (``step.distance_tables``).

``torch.cdist(anchor, positive)`` is the ``(N, N)`` table of every anchor against every
positive. A triplet (or contrastive) loss needs each anchor's distance to its own positive
and its own negative: the diagonal, or ``F.pairwise_distance``. ``relu(cdist(a, p) -
cdist(a, n) + margin).mean()`` compares every anchor with every sample's positive and
negative, all classes mixed: anchors are pulled towards all positives and pushed from all
negatives, and the embedding learns little about its classes.

Read from the step: an elementwise sum or difference of two square ``(N, N)`` outputs of
``torch.cdist`` of learnable embeddings. Batch-hard mining (a row's max or min taken first)
and the diagonal taken before the arithmetic stay quiet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import eval_forward_with_grad
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_ROWS = 8
COMBINING = {"sub", "__sub__", "__rsub__", "rsub", "add", "__add__", "__radd__"}


class TableWatch(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.tables: list[torch.Tensor] = []  # cdist outputs, held for identity during the step
        self.combined: tuple[int, ...] | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name == "cdist" and isinstance(result, torch.Tensor) and result.dim() == 2 and result.requires_grad \
                and result.shape[0] == result.shape[1] >= MIN_ROWS:
            self.tables.append(result)
        elif name in COMBINING and self.combined is None and len(args) >= 2 and len(self.tables) >= 2:
            if sum(any(arg is table for table in self.tables) for arg in args[:2]) == 2:
                self.combined = tuple(args[0].shape)
        return result


class DistanceTablesCheck(Check):
    """TRIPLET_ON_DISTANCE_TABLES: relu(cdist(a, p) - cdist(a, n) + m), every pair of the batch."""

    name = "step.distance_tables"
    stage = Stage.STEP
    codes = ("TRIPLET_ON_DISTANCE_TABLES",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        watch = TableWatch()
        try:
            with watch:
                eval_forward_with_grad(ctx)
        except Exception:
            findings.data["summary"] = "the step could not be observed"
            return
        if watch.combined is None:
            findings.data["summary"] = f"{len(watch.tables)} cdist table(s), none combined elementwise"
            return
        rows = watch.combined[0]
        findings.data["summary"] = f"two {watch.combined} cdist tables combined"
        findings.warning(
            "TRIPLET_ON_DISTANCE_TABLES",
            f"the loss subtracts (or adds) two {watch.combined} tables from torch.cdist elementwise: each is every "
            f"anchor's distance to every one of the {rows} positives (negatives) of the batch, so a triplet term "
            "relu(d_ap - d_an + margin) is taken over every pair of samples, all classes mixed: each anchor is pulled "
            "towards every sample's positive and pushed from every negative, not its own, and the embedding learns "
            "little about its classes",
            "Use each anchor's own pair: F.pairwise_distance(anchor, positive) and F.pairwise_distance(anchor, "
            "negative) (or the diagonal of cdist), or nn.TripletMarginLoss(margin) on (anchor, positive, negative).",
        )
