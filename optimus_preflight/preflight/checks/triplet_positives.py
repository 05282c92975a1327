"""Triplets whose positives are no nearer their anchors than the negatives (``data.triplet_positives``).

A triplet Dataset returns ``(anchor, positive, negative)``: the positive from the anchor's
class (identity, product), the negative from another. A sampler that draws the positive from
any class (``random.choice`` over every class, an index into the wrong list) makes most
"positives" strangers, and the triplet loss pulls different classes together while it
still falls.

Read from the inputs: where the validation split is ``(x, labels)``, same-class samples are
nearer each other than samples of different classes by some factor. Training positives drawn
from the anchor's class are nearer their anchors than the negatives by a similar factor;
positives drawn from any class are not nearer at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.split_labels import features_and_labels, read_width
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SAMPLES = 512
MIN_SAMPLES = 64
BUDGET_S = 2.0
CLASSES_APART = 1.05  # validation: distance between classes over distance within one, at least
KEPT_SHARE = 0.25  # of that margin the training positives keep, at most, to be strangers


def triplet(batch: Any) -> tuple[torch.Tensor, ...] | None:
    """(anchors, positives, negatives) flattened to (B, D): three float tensors of one shape."""
    if not isinstance(batch, (list, tuple)) or len(batch) != 3:
        return None
    if not all(isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 2 for t in batch):
        return None
    if len({tuple(t.shape) for t in batch}) != 1:
        return None
    return tuple(read_width(t.detach().float().reshape(len(t), -1)).cpu() for t in batch)


def class_separation(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Mean distance between samples of different classes over that within one class."""
    distances = torch.cdist(x, x)
    same = y[:, None] == y[None, :]
    off_diagonal = ~torch.eye(len(y), dtype=torch.bool)
    within, between = distances[same & off_diagonal], distances[~same]
    if within.numel() < MIN_SAMPLES or between.numel() < MIN_SAMPLES or float(within.mean()) == 0:
        return None
    return float(between.mean() / within.mean())


def triplet_separation(parts: list[tuple[torch.Tensor, ...]]) -> float | None:
    """Mean anchor-negative distance over mean anchor-positive distance of (a, p, n) triplets."""
    anchors, positives, negatives = (torch.cat([part[k] for part in parts]) for k in range(3))
    near = float((anchors - positives).norm(dim=1).mean())
    return float((anchors - negatives).norm(dim=1).mean()) / near if near > 0 else None


class TripletPositivesCheck(Check):
    """TRIPLET_POSITIVES_RANDOM: positives no nearer their anchors than the negatives."""

    name = "data.triplet_positives"
    stage = Stage.DATA
    codes = ("TRIPLET_POSITIVES_RANDOM",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if triplet(ctx.artifacts.first_batch) is None or ctx.val_loader is None:
            findings.data["summary"] = "no (anchor, positive, negative) batch beside a labelled validation split"
            return
        separation, width = self._validation_separation(ctx, findings)
        if separation is None:
            return
        parts = read_samples(ctx, self.name, findings, ctx.train_loader, "training triplets", triplet, SAMPLES,
                             BUDGET_S)
        if not parts or width != parts[0][0].shape[1]:
            findings.data["summary"] = "too few samples or classes to compare"
            return
        anchors, positives, negatives = (torch.cat([part[k] for part in parts]) for k in range(3))
        near = float((anchors - positives).norm(dim=1).mean())
        far = float((anchors - negatives).norm(dim=1).mean())
        if near == 0:
            return
        kept = far / near
        findings.data.update(validation_separation=round(separation, 4), triplet_separation=round(kept, 4))
        findings.data["summary"] = f"negatives {kept:.3f}x as far as positives; classes {separation:.3f}x apart"
        if separation < CLASSES_APART or kept - 1 > KEPT_SHARE * (separation - 1):
            return
        findings.warning(
            "TRIPLET_POSITIVES_RANDOM",
            f"the training positives are no nearer their anchors than the negatives: over {len(anchors)} triplets "
            f"the negatives lie {kept:.3f} times as far from their anchors as the positives, while in the "
            f"validation split samples of different classes lie {separation:.3f} times as far apart as samples of "
            "one class. The triplet Dataset draws the positive from a random class (random.choice over every class, "
            "or an index into the wrong class's list) instead of the anchor's own class, so most 'positives' are "
            "other identities and the loss pulls different classes together",
            "Draw the positive from the anchor's class: positive = x[random.choice(indices_by_class[y[i]])] "
            "(excluding i itself), and the negative from any other class.",
            "data.train",
        )

    def _validation_separation(self, ctx: PreflightContext, findings: Findings) -> tuple[float | None, int]:
        """(how much farther apart classes are than one class's samples, input width) in the validation
        split: from (inputs, labels) batches, or from triplets built right, (anchor, positive, negative)."""
        val = read_samples(ctx, self.name, findings, ctx.val_loader, "labelled validation samples", features_and_labels,
                           SAMPLES, BUDGET_S)
        if val:
            x, y = torch.cat([part[0] for part in val]), torch.cat([part[1] for part in val])
            found = class_separation(x[:SAMPLES], y[:SAMPLES])
            if found is None:
                findings.data["summary"] = "too few samples or classes to compare"
            return found, x.shape[1]
        triplets = read_samples(ctx, self.name, findings, ctx.val_loader, "validation triplets", triplet, SAMPLES,
                                BUDGET_S)
        if not triplets:
            findings.data["summary"] = "the validation batches are neither (inputs, labels) nor triplets"
            return None, 0
        found = triplet_separation(triplets)
        if found is None:
            findings.data["summary"] = "too few samples or classes to compare"
        return found, triplets[0][0].shape[1]
