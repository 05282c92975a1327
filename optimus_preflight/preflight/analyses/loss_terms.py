"""Loss terms reduced on different scales (pure, on the loss's autograd graph).

``F.mse_loss(recon, x)`` averages over every element; ``-0.5 * torch.sum(1 + logvar - mu**2
- logvar.exp())`` sums over the batch and the latents. Added together, the summed term
weighs ``B * D`` times more per element than the averaged one: a VAE's KL term then wins,
the posterior collapses to the prior and the decoder outputs the mean. The same holds for
any per-element mean beside a term summed over the batch.

Read from the graph of the returned loss: the terms of its top-level sum (past constant
weights), one a criterion with ``reduction='mean'`` over at least ``MIN_ELEMENTS`` values, another
a full ``.sum()`` of a tensor whose first axis is the batch. A penalty summed over parameters
(weight decay by hand) has no batch axis; a sum divided by the batch size is a mean per sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CRITERION_BACKWARDS = {"MseLossBackward0": "mse_loss", "L1LossBackward0": "l1_loss",
                       "SmoothL1LossBackward0": "smooth_l1_loss", "HuberLossBackward0": "huber_loss",
                       "BinaryCrossEntropyBackward0": "binary_cross_entropy",
                       "BinaryCrossEntropyWithLogitsBackward0": "binary_cross_entropy_with_logits"}
MEAN = 1  # at::Reduction::Mean
MIN_ELEMENTS = 64  # values the mean runs over, so the difference in scale is large
WEIGHTS = ("MulBackward0", "MulBackward1", "NegBackward0")  # a constant weight on a term


@dataclass
class MixedReductions:
    criterion: str
    averaged: tuple[int, ...]  # the shape the criterion averages over
    summed: tuple[int, ...]  # the shape the other term sums over


def _terms(node: Any, depth: int = 0) -> list[Any]:
    """The terms of a (nested) sum: the nodes below AddBackward, past constant weights."""
    name = type(node).__name__
    children = [child for child, _ in getattr(node, "next_functions", ()) if child is not None]
    if name.startswith("AddBackward") and depth < 8:
        return [term for child in children for term in _terms(child, depth + 1)]
    if name in WEIGHTS and len(children) == 1 and depth < 8:
        return _terms(children[0], depth + 1)
    return [node]


def mixed_reductions(loss: Any, batch_size: int) -> MixedReductions | None:
    """A per-element mean criterion added to a term summed over the batch (pure)."""
    node = getattr(loss, "grad_fn", None)
    if node is None or batch_size < 2:
        return None
    terms = _terms(node)
    averaged = summed = None
    criterion = ""
    for term in terms:
        name = type(term).__name__
        if name in CRITERION_BACKWARDS and averaged is None:
            try:
                reduction, values = term._saved_reduction, term._saved_self
            except (AttributeError, RuntimeError):
                continue
            if reduction == MEAN and values.numel() >= MIN_ELEMENTS:
                averaged, criterion = tuple(values.shape), CRITERION_BACKWARDS[name]
        elif name == "SumBackward0" and summed is None:
            try:
                sizes = tuple(int(size) for size in term._saved_self_sym_sizes)
            except (AttributeError, RuntimeError):
                continue
            if len(sizes) >= 1 and sizes[0] == batch_size:
                summed = sizes
    if averaged is None or summed is None:
        return None
    return MixedReductions(criterion, averaged, summed)
