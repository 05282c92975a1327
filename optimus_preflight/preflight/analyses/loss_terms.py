"""Loss terms reduced on different scales (pure, on the loss's autograd graph).

``F.mse_loss(recon, x)`` averages over every element; ``-0.5 * torch.sum(1 + logvar - mu**2
- logvar.exp())`` sums over the batch and the latents. Added together, the summed term
weighs ``B * D`` times more per element than the averaged one: a VAE's KL term then wins,
the posterior collapses to the prior and the decoder outputs the mean. The same holds for
any per-element mean beside a term summed over the batch.

Read from the graph of the returned loss: the terms of its top-level sum (past constant
weights), and for each the chain of reductions down to the tensor it reduces (criteria
with their ``reduction``, ``mean``/``sum`` over all dims or some, a division by the batch
size or by the values per sample). Each term's batch axis and its per-sample values are
then averaged or summed. Two terms disagree when one averages each sample's values (at
least ``MIN_VALUES`` of them) and the other sums its own (a BCE averaged over pixels
beside a KL summed over latents and divided by the batch), or when one sums over the batch
and the other averages over it (``kl.sum(dim=0).mean()``: the batch summed, the latents
averaged). A penalty summed over parameters (weight decay by hand) has no batch axis; a sum
divided by the batch size is a mean per sample; weights a user writes (``beta * kl``) are
left alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

CRITERION_BACKWARDS = {"MseLossBackward0": "mse_loss", "L1LossBackward0": "l1_loss",
                       "SmoothL1LossBackward0": "smooth_l1_loss", "HuberLossBackward0": "huber_loss",
                       "BinaryCrossEntropyBackward0": "binary_cross_entropy",
                       "BinaryCrossEntropyWithLogitsBackward0": "binary_cross_entropy_with_logits"}
CLASS_CRITERIA = {"NllLossBackward0": "cross_entropy", "NllLoss2DBackward0": "cross_entropy"}  # (B, C, ...) inputs
MEAN, SUM = 1, 2  # at::Reduction
MIN_ELEMENTS = 64  # values the mean runs over, so the difference in scale is large
MIN_VALUES = 16  # values per sample a term averages before its weight is visibly below a sum's
MIN_BATCH = 8  # samples before a sum over the batch weighs a term visibly more
WEIGHTS = ("MulBackward0", "MulBackward1", "NegBackward0")  # a constant weight on a term
MAX_CHAIN = 8


@dataclass
class MixedReductions:
    criterion: str
    averaged: tuple[int, ...]  # the shape the averaged term reduces
    summed: tuple[int, ...]  # the shape the other term reduces
    kind: str = "all"  # "all": a mean over everything beside a sum over everything; "values"; "batch"
    factor: float = 0.0  # how many times more the second term weighs each of its values
    summed_term: str = ""  # what the second term is, where it is a criterion


@dataclass
class TermReduction:
    name: str  # the criterion, or "mean"/"sum"
    shape: tuple[int, ...]  # the tensor the chain reduces
    batch: str | None  # "mean" or "sum" over dim 0
    values: str | None  # "mean", "sum" or None (no per-sample values) over the other dims
    whole: str | None  # the single reduction of every dim at once, where there is one


def _terms(node: Any, depth: int = 0) -> list[Any]:
    """The terms of a (nested) sum or difference: the nodes below Add/SubBackward, past constant weights."""
    name = type(node).__name__
    children = [child for child, _ in getattr(node, "next_functions", ()) if child is not None]
    if (name.startswith("AddBackward") or name.startswith("SubBackward")) and depth < 8:
        return [term for child in children for term in _terms(child, depth + 1)]
    if name in WEIGHTS and len(children) == 1 and depth < 8:
        return _terms(children[0], depth + 1)
    if name == "DivBackward0" and len(children) == 1 and depth == 0 and _divisor(node):
        # (rec + kl) / n: a constant divisor of the whole loss leaves the terms' weights relative to
        # each other as they are.
        return _terms(children[0], depth + 1)
    return [node]


def _divisor(node: Any) -> float | None:
    try:
        return _constant(node._saved_other)
    except (AttributeError, RuntimeError):
        return None


def _only_child(node: Any) -> Any | None:
    children = [child for child, _ in getattr(node, "next_functions", ()) if child is not None]
    return children[0] if len(children) == 1 else None


def _constant(value: Any) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.requires_grad:
        return float(value)
    return None


def term_reduction(node: Any, batch_size: int) -> TermReduction | None:
    """How one term of the loss reduces its tensor (pure): per axis, mean or sum."""
    chain: list[tuple[str, Any]] = []  # (kind, detail) from the top down
    divisor = 1.0
    name = ""
    for _ in range(MAX_CHAIN):
        kind = type(node).__name__
        try:
            if kind == "DivBackward0":
                other = _constant(node._saved_other)
                if other is None or not other:
                    return None
                divisor *= other
                node = _only_child(node)
            elif kind in WEIGHTS:
                node = _only_child(node)
            elif kind in ("MeanBackward0", "SumBackward0"):
                if chain:
                    break  # a whole reduction below another one: the tensor is already reduced
                chain.append(("mean" if kind.startswith("Mean") else "sum", None))
                shape = tuple(int(size) for size in node._saved_self_sym_sizes)
                name = "mean" if kind.startswith("Mean") else "sum"
                node = _only_child(node)
            elif kind in ("MeanBackward1", "SumBackward1"):
                sizes = tuple(int(size) for size in node._saved_self_sym_sizes)
                chain.append(("mean" if kind.startswith("Mean") else "sum",
                              (tuple(int(d) for d in node._saved_dim), bool(node._saved_keepdim), sizes)))
                name = name or ("mean" if kind.startswith("Mean") else "sum")
                node = _only_child(node)
                shape = sizes
            elif kind in CRITERION_BACKWARDS or kind in CLASS_CRITERIA:
                reduction = int(node._saved_reduction)
                shape = tuple(int(size) for size in node._saved_self.shape)
                if kind in CLASS_CRITERIA:
                    shape = shape[:1] + shape[2:]  # the class dim is not a value
                name = CRITERION_BACKWARDS.get(kind) or CLASS_CRITERIA[kind]
                if reduction in (MEAN, SUM):
                    chain.append(("mean" if reduction == MEAN else "sum", None))
                break
            else:
                break
        except (AttributeError, RuntimeError, TypeError):
            return None
        if node is None:
            return None
    if not chain:
        return None
    modes: list[str | None] = [None] * len(shape)
    remaining = list(range(len(shape)))
    for mode, detail in reversed(chain):  # from the tensor up
        if detail is None:
            for dim in remaining:
                modes[dim] = mode
            remaining = []
            continue
        dims, keepdim, sizes = detail
        if len(sizes) != len(remaining):
            return None
        picked = [remaining[d % len(sizes)] for d in dims]
        for dim in picked:
            modes[dim] = mode
        if not keepdim:
            remaining = [dim for dim in remaining if dim not in picked]
    if remaining or not shape or shape[0] != batch_size:
        return None  # not reduced to a scalar, or no batch axis (a penalty over parameters)
    value_modes = set(modes[1:])
    values = value_modes.pop() if len(value_modes) == 1 else (None if not value_modes else "mixed")
    batch = modes[0]
    per_sample = math.prod(shape[1:])
    if divisor == batch_size and batch == "sum":
        batch = "mean"
    elif divisor == per_sample and values == "sum" and per_sample > 1:
        values = "mean"
    elif divisor == math.prod(shape) and batch == values == "sum":
        batch = values = "mean"
    elif divisor != 1.0:
        return None  # divided by a count of its own (positives, tokens, pairs): a normalisation not read here
    whole = chain[0][0] if len(chain) == 1 and chain[0][1] is None else None
    if divisor != 1.0:
        whole = None
    return TermReduction(name, shape, batch, values if per_sample > 1 else None, whole)


def mixed_reductions(loss: Any, batch_size: int) -> MixedReductions | None:
    """Two terms of the loss that weigh their values on different scales (pure)."""
    node = getattr(loss, "grad_fn", None)
    if node is None or batch_size < 2:
        return None
    reductions = [found for term in _terms(node) if (found := term_reduction(term, batch_size)) is not None]
    # A criterion averaged over everything beside a plain sum over everything (the batch included).
    averaged = next((r for r in reductions if r.name in CRITERION_BACKWARDS.values() and r.whole == "mean"
                     and math.prod(r.shape) >= MIN_ELEMENTS), None)
    summed = next((r for r in reductions if r.name == "sum" and r.whole == "sum"), None)
    if averaged is not None and summed is not None:
        return MixedReductions(averaged.name, averaged.shape, summed.shape, "all", float(math.prod(averaged.shape)))
    for mean_term in reductions:
        for sum_term in reductions:
            if mean_term is sum_term:
                continue
            per_sample = math.prod(mean_term.shape[1:])
            if mean_term.values == "mean" and per_sample >= MIN_VALUES and sum_term.values == "sum" \
                    and mean_term.batch == sum_term.batch:
                return MixedReductions(mean_term.name, mean_term.shape, sum_term.shape, "values", float(per_sample),
                                       sum_term.name)
            if mean_term.batch == "mean" and sum_term.batch == "sum" and batch_size >= MIN_BATCH:
                return MixedReductions(mean_term.name, mean_term.shape, sum_term.shape, "batch",
                                       float(batch_size), sum_term.name)
    return None
