"""Paired inputs taken apart in the training split (``data.pair_association``).

Contrastive and matching tasks train on pairs: an image and its caption, two views of one
sample, a query and its document. A Dataset that reads the second element at another index
(``txt[order[i]]`` with a separately shuffled list, one list sorted or filtered on its own)
keeps every shape and dtype; the loss still falls by memorising, and nothing that transfers
is learned.

Read from the data only: where two samples are alike in one element of the pair, they are
alike in the other too when the pairs belong together (each element is a view of one
underlying thing). Per split, the share of each sample's nearest neighbours by the first
element that are also among its nearest neighbours by the second is compared with chance.
Validation pairs that agree well above chance beside training pairs of the same layout that
agree no better than chance were taken apart in training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.split_labels import read_width
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SAMPLES = 256  # per split, the same number on both sides so the overlaps compare
MIN_SAMPLES = 128
BUDGET_S = 2.0
NEIGHBOURS = 10
RELATED = 5.0  # validation's overlap at least this many times chance ...
RELATED_FLOOR = 0.15  # ... and at least this share of the neighbours
UNRELATED = 2.0  # training's overlap at most this many times chance


def float_pair(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The batch's two float tensors of one batch size, flattened to (B, D) rows; None for a batch
    with another number of float tensors."""
    floats = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided
              and leaf.is_floating_point() and leaf.dim() >= 2]
    if len(floats) != 2 or floats[0].shape[0] != floats[1].shape[0]:
        return None
    first, second = (read_width(t.detach().float().reshape(len(t), -1)).cpu() for t in floats)
    return first, second


def neighbour_overlap(first: torch.Tensor, second: torch.Tensor, k: int = NEIGHBOURS) -> float:
    """Mean share of each row's k nearest rows by ``first`` that are among its k nearest by
    ``second`` (columns standardised; the row itself left out) (pure)."""
    def nearest(x: torch.Tensor) -> torch.Tensor:
        x = (x - x.mean(0)) / x.std(0).clamp(min=1e-8)
        distances = torch.cdist(x, x)
        distances.fill_diagonal_(float("inf"))
        return distances.topk(k, largest=False).indices

    a, b = nearest(first), nearest(second)
    shared = (a[:, :, None] == b[:, None, :]).any(-1).float().sum(1)
    return float(shared.mean()) / k


class PairAssociationCheck(Check):
    """PAIRS_UNRELATED: training pairs whose two elements agree no better than chance, where validation's do."""

    name = "data.pair_association"
    stage = Stage.DATA
    codes = ("PAIRS_UNRELATED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if float_pair(ctx.artifacts.first_batch) is None or ctx.val_loader is None:
            findings.data["summary"] = "no pair of float inputs beside a validation split"
            return
        splits = []
        for loader, what in ((ctx.val_loader, "validation pairs"), (ctx.train_loader, "training pairs")):
            parts = read_samples(ctx, self.name, findings, loader, what, float_pair, SAMPLES, BUDGET_S)
            if not parts:
                findings.data["summary"] = "the validation batches hold another layout"
                return
            first, second = (torch.cat([part[k] for part in parts])[:SAMPLES] for k in range(2))
            splits.append((first, second))
        rows = min(len(splits[0][0]), len(splits[1][0]))
        if rows < MIN_SAMPLES or splits[0][0].shape[1] != splits[1][0].shape[1] \
                or splits[0][1].shape[1] != splits[1][1].shape[1]:
            findings.data["summary"] = "too few pairs to compare"
            return
        val, train = (neighbour_overlap(a[:rows], b[:rows]) for a, b in splits)
        chance = NEIGHBOURS / (rows - 1)
        findings.data.update(validation_overlap=round(val, 4), training_overlap=round(train, 4), chance=round(chance, 4))
        findings.data["summary"] = f"neighbours shared across the pair: training {train:.3f}, validation {val:.3f}"
        if val < max(RELATED * chance, RELATED_FLOOR) or train > UNRELATED * chance:
            return
        findings.warning(
            "PAIRS_UNRELATED",
            f"the two elements of the training pairs are unrelated: samples alike in the first element are alike in "
            f"the second no more often than chance ({train:.1%} of the {NEIGHBOURS} nearest neighbours shared, "
            f"chance {chance:.1%}), while in the validation pairs they are ({val:.1%}). The training pairs were taken "
            "apart: the second element read at another index (txt[order[i]] with a separately shuffled list, "
            "captions sorted by their text and images by id, one list filtered or sorted on its own), so the loss "
            "pulls together pairs that do not belong together and learns nothing that transfers",
            "Keep each pair together: index both elements with the same i in __getitem__ (img[i], txt[i]), and "
            "shuffle, sort or filter the pairs as one list (one permutation applied to both).",
            "data.train",
        )
