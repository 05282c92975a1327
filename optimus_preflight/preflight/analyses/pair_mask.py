"""In-batch positives for a metric-learning loss (pure watch over a step's calls).

Batch-hard triplet, contrastive and supervised-contrastive losses build their pairs inside
the batch: ``same = labels[:, None] == labels[None, :]``. A sample whose label no other
sample of the batch shares has no positive, so its term is empty (or only pushes away).
Drawn at random from many classes, most of a batch is such samples; P classes x K samples
per batch (a PK sampler) is what these losses need.

Read from the first ``(B, B)`` equality of a ``(B, 1)`` and a ``(1, B)`` view of one integer
vector: the share of rows with no other True.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EQUALITIES = ("eq", "__eq__")


@dataclass
class PairMask:
    rows: int
    without_positive: int  # rows whose label no other row shares
    labels: int  # distinct labels in the batch


def pair_mask(name: str, args: tuple) -> PairMask | None:
    """The positives of ``labels[:, None] == labels[None, :]`` (pure)."""
    if name not in EQUALITIES or len(args) < 2:
        return None
    left, right = args[0], args[1]
    if not (isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor)):
        return None
    if left.dim() != 2 or right.dim() != 2 or left.is_floating_point() or right.is_floating_point():
        return None
    rows = left.shape[0]
    if left.shape != (rows, 1) or right.shape != (1, rows) or rows < 4:
        return None
    if not torch.equal(left.reshape(-1), right.reshape(-1)):
        return None
    labels = left.reshape(-1)
    counts = torch.bincount(torch.unique(labels, return_inverse=True)[1])
    alone = int((counts == 1).sum())
    return PairMask(rows, alone, int(counts.numel()))

