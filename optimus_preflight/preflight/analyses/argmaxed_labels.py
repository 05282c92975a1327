"""A single-label criterion trained on the argmax of multi-hot labels (pure).

Multi-label data (a post with 1-3 tags, an image with several objects) carries a ``(B, C)``
0/1 tensor. Fed to ``cross_entropy`` as ``tags.argmax(1)``, it trains each sample on its
lowest-index label only, and the softmax pushes the sample's other true labels down. The
targets are valid class ids of the right shape, so nothing downstream sees it: read from the
batch, the criterion's ``(B,)`` target equals the argmax of a ``(B, C)`` 0/1 tensor over the
criterion's own C classes whose rows often hold two labels or more. One-hot rows (one label
each) argmaxed into class ids are the usual, correct conversion and stay quiet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from optimus_preflight.training.batches import leaves

MULTI_ROWS = 0.2  # rows holding two labels or more


@dataclass
class ArgmaxedMultiHot:
    function: str
    shape: tuple[int, ...]
    multi_rows: float  # share of rows with two labels or more
    most_labels: int  # the most labels any row holds


def argmaxed_multi_hot(calls: list, batch: Any) -> ArgmaxedMultiHot | None:
    for call in calls:
        target = getattr(call, "class_target", None)
        if target is None or not call.n_classes:
            continue
        for leaf in leaves(batch):
            if not isinstance(leaf, torch.Tensor) or leaf.dim() != 2 or leaf.shape != (target.shape[0], call.n_classes):
                continue
            values = leaf.detach()
            if values.dtype == torch.bool:
                values = values.to(torch.uint8)
            if not bool(((values == 0) | (values == 1)).all()):
                continue
            counts = values.float().sum(1)
            multi = float((counts >= 2).float().mean())
            if multi < MULTI_ROWS or not torch.equal(values.float().argmax(1).to(target.device), target.long()):
                continue
            return ArgmaxedMultiHot(call.function, tuple(leaf.shape), multi, int(counts.max()))
    return None
