"""Pairs and triplets whose partner is the anchor itself (``data.pair_partners``).

A siamese or contrastive Dataset returns ``(x1, x2, label)``: for a positive pair it draws
another sample ``j`` of the anchor's class; a triplet Dataset returns ``(anchor, positive,
negative)``. Returning ``self.x[idx]`` where ``self.x[j]`` was meant makes every positive
pair the anchor twice: its distance is 0 whatever the weights, the positive term of the
loss is solved from the first step, and nothing ever pulls two different samples of one
class together (only the negatives train).

Read from the training batches, by content: the rows where the two inputs are identical
tensors. A pair Dataset fires when those rows are most of one label value and that value
only (an autoencoder's ``(x, x)`` is identical in every row and has no such label; pairs
of distinct samples are identical in no row); a triplet Dataset when a good share of its
positives equal their anchors while the negatives do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SAMPLES = 512
BUDGET_S = 2.0
MIN_ROWS = 32
MIN_SELF_ROWS = 8  # identical pairs: a few could be the same sample drawn twice by chance
LABEL_SHARE = 0.8  # of one label value's rows identical: that value's partner is the anchor
TRIPLET_SHARE = 0.25  # of the triplets whose positive is the anchor


def _rows(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(len(tensor), -1).cpu()


def partner_parts(batch: Any) -> tuple[torch.Tensor, ...] | None:
    """(first, second, labels or an empty tensor, third or an empty tensor): two inputs of one
    shape, then a (B,) label (a pair) or a third input of that shape (a triplet)."""
    if not isinstance(batch, (list, tuple)) or len(batch) != 3:
        return None
    if not all(isinstance(t, torch.Tensor) for t in batch):
        return None
    first, second, third = batch
    if first.dim() < 2 or first.shape != second.shape or len(first) < 2:
        return None
    empty = torch.empty(0)
    if third.shape == first.shape:
        return _rows(first), _rows(second), empty, _rows(third)
    if third.dim() <= 1 or (third.dim() == 2 and third.shape[1] == 1):
        if third.numel() == len(first):
            return _rows(first), _rows(second), third.detach().reshape(-1).cpu(), empty
    return None


def identical_rows(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    return (first == second).all(dim=1)


def label_of_self_pairs(same: torch.Tensor, labels: torch.Tensor) -> tuple[float, int, int] | None:
    """(label value, identical rows, rows of that value) when the identical rows carry one
    label value only and are most of that value's rows; None otherwise."""
    if int(same.sum()) < MIN_SELF_ROWS or bool(same.all()):
        return None
    values = labels[same].unique()
    if values.numel() != 1:
        return None
    value = values[0]
    of_value = int((labels == value).sum())
    if int(same.sum()) < LABEL_SHARE * of_value or of_value == len(labels):
        return None
    return float(value), int(same.sum()), of_value


class PairPartnersCheck(Check):
    """PAIR_PARTNER_IS_ANCHOR: the positive partner of a pair or triplet is the anchor itself."""

    name = "data.pair_partners"
    stage = Stage.DATA
    codes = ("PAIR_PARTNER_IS_ANCHOR",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if partner_parts(ctx.artifacts.first_batch) is None:
            findings.data["summary"] = "no (x1, x2, label) pair or (anchor, positive, negative) batch"
            return
        parts = read_samples(ctx, self.name, findings, ctx.train_loader, "training pairs", partner_parts, SAMPLES,
                             BUDGET_S)
        if not parts:
            findings.data["summary"] = "the training batches are not pairs or triplets throughout"
            return
        first, second, labels, third = (torch.cat([part[k] for part in parts]) for k in range(4))
        if len(first) < MIN_ROWS:
            findings.data["summary"] = f"{len(first)} rows read: too few"
            return
        same = identical_rows(first, second)
        findings.data.update(rows=len(first), identical=int(same.sum()))
        findings.data["summary"] = f"{int(same.sum())} of {len(first)} rows pair a sample with itself"
        if third.numel():
            negatives_same = identical_rows(first, third)
            if int(same.sum()) >= max(MIN_SELF_ROWS, TRIPLET_SHARE * len(first)) and not bool(negatives_same.any()):
                findings.warning(
                    "PAIR_PARTNER_IS_ANCHOR",
                    f"in {int(same.sum())} of {len(first)} training triplets the positive is the anchor itself "
                    "(identical tensors), while no negative is: the anchor-positive distance is 0 whatever the "
                    "weights, so the positive term is solved from the first step and nothing pulls two different "
                    "samples of one class together. The Dataset draws a positive index j but returns the anchor's "
                    "own sample, x[idx], in its place",
                    "Return the drawn positive: x[j] with j from the anchor's class and j != idx (indices_by_class[y]"
                    " without idx), not x[idx].",
                    "data.train",
                )
            return
        found = label_of_self_pairs(same, labels)
        if found is None:
            return
        value, count, of_value = found
        findings.warning(
            "PAIR_PARTNER_IS_ANCHOR",
            f"in {count} of the {of_value} training pairs labelled {value:g} the second input is the first one "
            f"itself (identical tensors), and no pair of another label is: every positive pair is the anchor "
            "paired with itself, at distance 0 whatever the weights, so its term of the loss is solved from the "
            "first step and nothing pulls two different samples of one class together (only the negative pairs "
            "train). The Dataset draws a same-class index j but returns self.x[idx] as the partner",
            "Return the drawn partner: self.x[j] with j from the anchor's class and j != idx, not self.x[idx].",
            "data.train",
        )
