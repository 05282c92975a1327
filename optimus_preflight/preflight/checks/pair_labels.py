"""Which pairs the loss pulls together (``step.pair_labels``).

``PAIR_LABELS_INVERTED``: a batch of pairs ``(a, b, y)`` whose label marks the similar pairs
one way in the data and the other way in the loss. Hadsell's contrastive loss appears in
two conventions (``y = 1`` "similar" in most code, "dissimilar" in the paper and some
tutorials); ``CosineEmbeddingLoss`` wants +1 for similar pairs. Copied with the other
convention, the loss pushes the matching pairs apart and pulls the others together, and
nothing fails: the loss goes down while the embedding learns the opposite.

Both sides are measured, not read from the code:
- the data: pairs of one label are much closer in input space than pairs of the other
  (two views of one item against two items), so that label marks the similar pairs;
- the loss: with the model in eval mode, the batch's loss is computed again with ``b``
  replaced by ``a`` on the rows of one label (those pairs made identical). A loss that
  wants those pairs similar goes down; one that wants them apart goes up.
The check fires when making the data's similar pairs identical raises the loss and making
its dissimilar pairs identical lowers it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.eval_forward import eval_loss
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_ROWS = 4  # pairs of each label
CLOSER = 0.85  # mean input distance of the similar pairs, as a share of the other pairs'
EFFECT = 0.05  # relative change of the loss that counts
CLOSER_ROWS = 0.75  # of a triplet batch's rows, where one field is nearer the anchor than the other


def pair_fields(batch: Any) -> tuple[int, int, int] | None:
    """(a, b, label) positions of a ``(a, b, y)`` tuple batch of two same-shaped float tensors
    and a (B,) label with two values, each on at least ``MIN_ROWS`` rows; None otherwise."""
    if not isinstance(batch, (tuple, list)) or len(batch) != 3 or not all(isinstance(t, torch.Tensor) for t in batch):
        return None
    a, b, y = batch
    if not (a.is_floating_point() and b.is_floating_point() and a.shape == b.shape and a.dim() >= 2):
        return None
    if y.dim() != 1 or y.shape[0] != a.shape[0]:
        return None
    values = torch.unique(y.detach())
    if len(values) != 2 or min(int((y == v).sum()) for v in values) < MIN_ROWS:
        return None
    return 0, 1, 2


def input_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row distance of the pairs, each feature standardised over both sides of the batch."""
    flat_a, flat_b = a.detach().float().flatten(1), b.detach().float().flatten(1)
    both = torch.cat([flat_a, flat_b])
    scale = both.std(dim=0).clamp_min(1e-6)
    return ((flat_a - flat_b) / scale).norm(dim=1)


def is_triplet(batch: Any) -> bool:
    """A ``(anchor, b, c)`` tuple batch of three same-shaped float tensors."""
    return (isinstance(batch, (tuple, list)) and len(batch) == 3
            and all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in batch)
            and batch[0].dim() >= 2 and batch[0].shape[0] >= 2 * MIN_ROWS
            and batch[0].shape == batch[1].shape == batch[2].shape)


class PairLabelsCheck(Check):
    """PAIR_LABELS_INVERTED: the loss pulls together the pairs the data marks dissimilar;
    TRIPLET_ROLES_SWAPPED: a triplet loss given the negative where the positive belongs."""

    name = "step.pair_labels"
    stage = Stage.STEP
    codes = ("PAIR_LABELS_INVERTED", "TRIPLET_ROLES_SWAPPED")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        if is_triplet(batch):
            self._triplet(ctx, batch, findings)
            return
        if pair_fields(batch) is None:
            findings.data["summary"] = "not a batch of labelled pairs"
            return
        a, b, y = batch
        distances = input_distances(a, b)
        values = sorted(torch.unique(y).tolist())
        mean = {value: float(distances[(y == value).cpu()].mean()) for value in values}
        near, far = sorted(values, key=lambda value: mean[value])
        findings.data.update(mean_input_distance={str(v): round(mean[v], 3) for v in values})
        if mean[near] > CLOSER * mean[far]:
            findings.data["summary"] = "the pairs of both labels are alike in input space"
            return
        try:
            base = eval_loss(ctx, batch)
            near_same = eval_loss(ctx, (a, torch.where(self._rows(y, near, a), a, b), y))
            far_same = eval_loss(ctx, (a, torch.where(self._rows(y, far, a), a, b), y))
        except Exception:
            findings.data["summary"] = "the loss could not be computed on changed pairs"
            return
        if base is None or near_same is None or far_same is None or base == 0:
            findings.data["summary"] = "no finite scalar loss"
            return
        findings.data.update(loss=base, loss_similar_pairs_identical=near_same, loss_other_pairs_identical=far_same)
        findings.data["summary"] = (f"label {near:g} marks the closer pairs; making them identical moves the loss "
                                    f"{base:.4g} -> {near_same:.4g}")
        scale = abs(base)
        if near_same > base + EFFECT * scale and far_same < base - EFFECT * scale:
            findings.warning(
                "PAIR_LABELS_INVERTED",
                f"in the data, pairs labelled {near:g} are the similar ones (their two sides are {mean[near]:.2f} "
                f"apart in standardised input space, pairs labelled {far:g} {mean[far]:.2f}), but the loss treats "
                f"{near:g} as dissimilar: making the {near:g}-pairs identical raises the loss ({base:.4g} -> "
                f"{near_same:.4g}) and making the {far:g}-pairs identical lowers it ({far_same:.4g}). The label "
                "convention of the pair loss is inverted (Hadsell's contrastive loss is written with y = 1 for "
                "dissimilar pairs in some sources and y = 1 for similar pairs in others), so training pushes "
                "matching pairs apart and pulls the others together",
                f"Flip the convention in the loss so that label {near:g} marks the pairs it pulls together: swap its "
                "two terms, or use 1 - y for 0/1 labels (-y for +1/-1 labels); CosineEmbeddingLoss wants +1 for "
                "similar pairs.",
            )

    @staticmethod
    def _triplet(ctx: PreflightContext, batch: Any, findings: Findings) -> None:
        """In the data, which of the two other fields is the anchor's positive (closer in input
        space on most rows); in the loss, which one it pulls towards the anchor (replacing it by
        the anchor lowers the loss). They must agree."""
        anchor, b, c = batch
        closer_b = float((input_distances(anchor, b) < input_distances(anchor, c)).float().mean())
        findings.data["b_closer_share"] = round(closer_b, 3)
        if 1 - CLOSER_ROWS < closer_b < CLOSER_ROWS:
            findings.data["summary"] = "neither field is clearly the anchor's positive in input space"
            return
        positive, negative = (1, 2) if closer_b >= CLOSER_ROWS else (2, 1)
        try:
            base = eval_loss(ctx, batch)
            fields = list(batch)
            fields[positive] = anchor
            positive_same = eval_loss(ctx, tuple(fields))
            fields = list(batch)
            fields[negative] = anchor
            negative_same = eval_loss(ctx, tuple(fields))
        except Exception:
            findings.data["summary"] = "the loss could not be computed on changed triplets"
            return
        if base is None or positive_same is None or negative_same is None:
            findings.data["summary"] = "no finite scalar loss"
            return
        findings.data.update(loss=base, loss_positive_is_anchor=positive_same, loss_negative_is_anchor=negative_same)
        findings.data["summary"] = (f"batch[{positive}] is the anchor's positive in the data; making it the anchor "
                                    f"moves the loss {base:.4g} -> {positive_same:.4g}")
        scale = max(abs(base), 1e-6)
        if not (positive_same > base + EFFECT * scale and negative_same < base - EFFECT * scale):
            return
        findings.warning(
            "TRIPLET_ROLES_SWAPPED",
            f"in the data, batch[{positive}] holds each anchor's positive ({closer_b if positive == 1 else 1 - closer_b:.0%}"
            f" of the rows are closer to the anchor than batch[{negative}] in standardised input space), but the loss "
            f"treats it as the negative: making batch[{positive}] equal to the anchor raises the loss ({base:.4g} -> "
            f"{positive_same:.4g}) and making batch[{negative}] equal to it lowers the loss ({negative_same:.4g}). "
            "The positive and the negative are swapped: each reaches the triplet loss in the other's place "
            "(triplet_margin_loss(anchor, positive, negative) takes the positive second), so training pushes each "
            "anchor's positive away and pulls its negative closer",
            "Pass the triplet in the loss's order: F.triplet_margin_loss(f(anchor), f(positive), f(negative)) (and "
            "check which field of the dataset's tuple holds the positive).",
        )

    @staticmethod
    def _rows(y: torch.Tensor, value: float, like: torch.Tensor) -> torch.Tensor:
        return (y == value).reshape(-1, *([1] * (like.dim() - 1)))
