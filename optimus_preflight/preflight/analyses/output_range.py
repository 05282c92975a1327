"""The range a regression criterion's predictions can take, read from the graph.

A regression head that ends in ``sigmoid`` (0, 1), ``tanh`` (-1, 1) or ``relu``/``softplus``/
``exp`` [0, inf) can only predict inside that range, whatever it learns; so can the cosine
similarity of two embeddings, [-1, 1], regressed onto similarity scores. When a good share of
the targets lies outside it (prices in dollars after a sigmoid, standardised targets after a
ReLU), the loss has a floor the model can never go below. The activation is the first
operation behind the criterion's input that is not a change of shape (``.squeeze()``,
``.view()``, ``.flatten()``), so a ReLU in the hidden layers says nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# grad_fn names that only move values around: the activation is behind them.
_SHAPE_ONLY = ("View", "Reshape", "Unsafe", "Squeeze", "Unsqueeze", "Expand", "Permute", "Transpose", "T",
               "Clone", "Contiguous", "Select", "Slice", "Alias", "ToCopy")
RANGES: dict[str, tuple[float, float]] = {
    "Sigmoid": (0.0, 1.0), "Tanh": (-1.0, 1.0), "Relu": (0.0, float("inf")), "Softplus": (0.0, float("inf")),
    "Exp": (0.0, float("inf")), "Softmax": (0.0, 1.0), "Hardsigmoid": (0.0, 1.0), "Relu6": (0.0, 6.0),
    "Hardtanh": (-1.0, 1.0), "Cosine similarity": (-1.0, 1.0),
}
OUTSIDE_SHARE = 0.1  # of the targets beyond the range's margin
MARGIN = 0.05  # of the range's width (or of 1 for a half-open range): rounding, label smoothing


@dataclass
class OutputRange:
    activation: str  # "sigmoid"
    low: float
    high: float
    outside: float  # share of the targets beyond the range (with the margin)


def _parents(node: object) -> list:
    return [parent for parent, _ in getattr(node, "next_functions", ()) if parent is not None]


def _divided_by_norm(node: object) -> bool:
    """A ``DivBackward0`` whose divisor is a vector norm within a few shape-only or clamp hops:
    ``x / x.norm(dim=-1, keepdim=True)``, ``F.normalize`` or ``cosine_similarity``'s own division."""
    if type(node).__name__ != "DivBackward0":
        return False
    frontier = _parents(node)
    for _ in range(4):
        if any(type(parent).__name__.startswith(("LinalgVectorNorm", "Norm")) for parent in frontier):
            return True
        frontier = [grand for parent in frontier if not type(parent).__name__.startswith("AccumulateGrad")
                    for grand in _parents(parent)]
    return False


def _is_cosine(node: object) -> bool:
    """A sum over the product of two norm-divided vectors: ``F.cosine_similarity`` or
    ``(F.normalize(a) * F.normalize(b)).sum(-1)``, whose values lie in [-1, 1]."""
    if not type(node).__name__.startswith("Sum"):
        return False
    parents = _parents(node)
    if len(parents) != 1 or type(parents[0]).__name__ != "MulBackward0":
        return False
    factors = _parents(parents[0])
    return len(factors) == 2 and all(_divided_by_norm(factor) for factor in factors)


def output_activation(tensor: torch.Tensor) -> str | None:
    """The grad_fn behind ``tensor``'s shape-only operations, by name without 'Backward0'
    ('Cosine similarity' for a cosine of two vectors)."""
    node, hops = tensor.grad_fn, 0
    while node is not None and hops < 8:
        if _is_cosine(node):
            return "Cosine similarity"
        name = type(node).__name__.removesuffix("Backward0").removesuffix("Backward1")
        if not name.startswith(_SHAPE_ONLY) or name.startswith(("Tanh", "Softplus", "Softmax", "Sigmoid")):
            return name
        parents = _parents(node)
        if len(parents) != 1:
            return name
        node, hops = parents[0], hops + 1
    return None


def constant_factor(node: object) -> tuple[float, object]:
    """(c, the node behind it) for an output written ``c * activation(...)`` with a constant
    scalar ``c`` (an action bound times a tanh); (1.0, node) otherwise."""
    if type(node).__name__ != "MulBackward0":
        return 1.0, node
    computed = _parents(node)  # a constant operand has no node: one parent is the product of a scalar
    if len(computed) != 1:
        return 1.0, node
    for constant in ("_saved_other", "_saved_self"):
        value = getattr(node, constant, None)
        if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.requires_grad:
            return float(value), computed[0]
    return 1.0, node


def _activation_at(node: object) -> str | None:
    name = type(node).__name__.removesuffix("Backward0").removesuffix("Backward1")
    return name if name.startswith(("Tanh", "Softplus", "Softmax", "Sigmoid")) else None


def bounded_output(inputs: torch.Tensor, target: torch.Tensor) -> OutputRange | None:
    """The output activation's range and the share of ``target`` outside it, for a
    prediction that comes out of a bounded activation; None otherwise."""
    if not inputs.requires_grad:
        return None
    factor, node = constant_factor(inputs.grad_fn)
    name = output_activation(inputs) if node is inputs.grad_fn else _activation_at(node)
    if name is None:
        return None
    bounds = next((RANGES[key] for key in RANGES if name == key), None)
    if bounds is None or not target.is_floating_point() or target.numel() == 0 or factor == 0:
        return None
    low, high = sorted((bounds[0] * factor, bounds[1] * factor))
    width = (high - low) if high != float("inf") else 1.0
    with torch.no_grad():
        values = target.detach().float().flatten()
        values = values[torch.isfinite(values)]
        if values.numel() == 0:
            return None
        outside = float(((values < low - MARGIN * width) | (values > high + MARGIN * width)).float().mean())
    return OutputRange(name.lower(), low, high, outside)


_SWAPS = ("Permute", "Transpose", "T")
_MATMULS = ("Addmm", "Mm", "Linear")


def _matmul_width(node: object) -> int | None:
    """The number of output features of a matmul node (its second operand's last size), or None
    where the node does not say."""
    try:
        return int(node._saved_mat2.shape[-1])  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return None


def features_on_last_dim(tensor: torch.Tensor) -> bool:
    """``tensor`` comes straight out of a linear layer (``Addmm``/``Mm`` behind the view that
    restores a 3-D shape) with no permute or transpose since: its features are on the last
    dim."""
    return _node_features_on_last_dim(tensor.grad_fn, tensor.shape[-1])


_REDUCTIONS = ("Amax", "Max", "Mean", "Sum", "Logsumexp")


def pooled_over_features(tensor: torch.Tensor) -> str | None:
    """The reduction (``amax``, ``mean``...) that made ``tensor`` from a 3-D or larger output of a
    linear layer over that output's last dim, its features (a head's classes); None otherwise."""
    node = tensor.grad_fn
    name = type(node).__name__.removesuffix("Backward0").removesuffix("Backward1") if node is not None else ""
    if name not in _REDUCTIONS:
        return None
    sizes = getattr(node, "_saved_self_sym_sizes", None)
    if sizes is None:
        saved = getattr(node, "_saved_self", None)
        sizes = tuple(saved.shape) if isinstance(saved, torch.Tensor) else None
    dims = getattr(node, "_saved_dim", None)
    if sizes is None or dims is None or len(sizes) < 3:
        return None
    dims = dims if isinstance(dims, tuple) else (dims,)
    resolved = {(d - 2**64 if d >= 2**63 else d) % len(sizes) for d in dims}
    if resolved != {len(sizes) - 1}:
        return None
    parents = _parents(node)
    if len(parents) != 1 or not _node_features_on_last_dim(parents[0], int(sizes[-1]), start=1):
        return None
    return name.lower()


def _node_features_on_last_dim(node: object, last: int, start: int = 0) -> bool:
    hops = start
    while node is not None and hops < 8:
        name = type(node).__name__.removesuffix("Backward0").removesuffix("Backward1")
        if name.startswith(_SWAPS):
            return False
        if name in _MATMULS:
            # A 2-D matmul's output needs a view to be 3-D (the linear's reshape); a view that
            # reorders the sizes (B, T, C) -> (B, C, T) has other features on the last dim.
            return hops > 0 and _matmul_width(node) in (None, last)
        parents = _parents(node)
        if name == "Add" and hops == start:
            # A linear layer on a non-contiguous input (an RNN's batch-first output) adds its bias
            # after the matmul: follow the branch that is not the bias parameter.
            computed = [parent for parent in parents if type(parent).__name__ != "AccumulateGrad"]
            if len(computed) == 1 and len(parents) == 2:
                node, hops = computed[0], hops + 1
                continue
            return False
        if not name.startswith(_SHAPE_ONLY):
            return False
        if len(parents) != 1:
            return False
        node, hops = parents[0], hops + 1
    return False
