"""Message passing that drops each node's own features (``GRAPH_NO_SELF_LOOPS``).

A GCN layer is ``A_hat @ (H W)`` with ``A_hat = D^-1/2 (A + I) D^-1/2``: the ``+ I`` (the
self-loops) keeps a node's own features in its new representation. Built from ``A``
alone, the propagation replaces every node by a weighted sum of its neighbours only; where
neighbours often carry other labels (heterophilous edges, noisy citations), the node's own
evidence is lost at every layer. Nothing fails, accuracy just stays low.

Read from the torch calls of one step: a product of a fixed (no grad), non-negative,
square ``(N, N)`` (or batched ``(B, N, N)``) matrix, dense or sparse, with a node
feature matrix of ``N`` rows, whose diagonal is exactly zero; or the same written over an
edge list, messages gathered by one end of each edge (``h[src]``) and summed into the other
(``index_add_(0, dst, ...)``, ``scatter_add``) where no edge has ``src == dst``. GraphSAGE and GIN propagate
with such a matrix on purpose and add the node's own features as a separate term
(``lin_r(h) + lin_l(A @ h)``, ``(1 + eps) * h + A @ h``): a sum or concatenation of a
propagated tensor with an unpropagated one of the same rows is that root term, and stays
quiet. So does a learned matrix (attention) or one whose diagonal holds anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

PRODUCTS = ("matmul", "mm", "bmm", "__matmul__", "__rmatmul__", "spmm")
COMBINING = ("add", "__add__", "__radd__", "add_", "__iadd__", "cat", "concat", "concatenate", "stack", "sub",
             "__sub__", "__rsub__", "hstack")
MIN_NODES = 8
_KEPT = 512  # propagated tensors held for the step (references, so ids are not reused)


SCATTERS = ("index_add", "index_add_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_",
            "index_reduce", "index_reduce_")
GATHERS = ("__getitem__", "index_select")


@dataclass
class Propagation:
    nodes: int
    mean_degree: float  # non-zeros per row of the matrix (edges per node)
    calls: int = 1
    edges: int | None = None  # an edge list scattered with index_add_ & co., not a matrix product


def edge_list_without_self_loops(target: Any, dim: Any, index: Any, source: Any,
                                 gathered: dict[int, list[torch.Tensor]]) -> Propagation | None:
    """``target.index_add_(0, dst, h[src] * w)``: messages gathered from the ``src`` end of
    each edge and summed into its ``dst`` end, where no edge joins a node to itself (pure;
    ``gathered`` holds the row indices of each length that picked rows of a node matrix). A
    message that also gathers the receiving node's rows (``h[dst]``, EdgeConv's
    ``mlp([x_i, x_j])``) carries the node's own features: that is its root term."""
    if dim != 0 or not all(isinstance(t, torch.Tensor) for t in (target, index, source)):
        return None
    if not target.is_floating_point() or target.dim() < 2 or index.dim() != 1 or index.is_floating_point():
        return None
    edges, nodes = index.shape[0], target.shape[0]
    if nodes < MIN_NODES or source.shape[0] != edges or edges < nodes:
        return None
    picked = [kept for kept in gathered.get(edges, []) if kept.device == index.device]
    with torch.no_grad():
        if not picked or any(kept is index or torch.equal(kept, index) for kept in picked):
            return None
        src = picked[-1]
        if bool((src == index).any()) or int(index.max()) >= nodes:
            return None
    return Propagation(nodes, edges / nodes, edges=edges)


def messages_to_source(target: Any, dim: Any, index: Any, source: Any,
                       gathered: dict[int, list[torch.Tensor]]) -> tuple[int, int] | None:
    """(nodes, edges) where ``target.index_add_(0, index, messages)`` scatters an edge list's messages
    back onto the end they were gathered from: ``index`` is a row of a (2, E) edge_index and every
    node gather of E rows in the step used that same row (``h[src]`` summed into ``src``), so each
    node aggregates copies of itself and never hears from its neighbours (pure)."""
    if not isinstance(dim, int) or dim != 0 or not all(isinstance(t, torch.Tensor) for t in (target, index, source)):
        return None
    base = index._base  # edge_index (2, E), or the (E, 2) tensor it was transposed from
    if index.dim() != 1 or index.is_floating_point() or not isinstance(base, torch.Tensor) or base.dim() != 2 \
            or sorted(base.shape) != sorted((2, index.shape[0])) or base.is_floating_point():
        return None
    edges, nodes = index.shape[0], target.shape[0]
    if nodes < MIN_NODES or source.shape[0] != edges or edges < nodes:
        return None
    picked = [kept for kept in gathered.get(edges, []) if kept.device == index.device]
    with torch.no_grad():
        if not picked or not all(kept is index or torch.equal(kept, index) for kept in picked):
            return None
        ends = base if base.shape[0] == 2 else base.t()
        if torch.equal(ends[0], ends[1]):  # only self-loops: both ends are the node itself
            return None
    return nodes, edges


DENSE_NODES = 32  # a complete graph this large is a built-in mistake, not a graph


def complete_adjacency(matrix: Any, features: Any) -> int | None:
    """The nodes of a fixed, non-negative, symmetric (N, N) propagation matrix with no zero entry
    at all, multiplied with node features: every node linked to every node, a graph averaged
    whole (``adj + torch.ones(n)`` broadcast over the rows where ``torch.eye(n)`` was meant) (pure)."""
    if not isinstance(matrix, torch.Tensor) or not isinstance(features, torch.Tensor) or matrix.requires_grad \
            or matrix.layout != torch.strided or not matrix.is_floating_point() or matrix.dim() != 2 \
            or features.dim() < 2:
        return None
    nodes = matrix.shape[0]
    if matrix.shape[1] != nodes or nodes < DENSE_NODES or features.shape[-2] != nodes:
        return None
    with torch.no_grad():
        if not bool((matrix > 0).all()) or not torch.allclose(matrix, matrix.T, rtol=1e-4, atol=1e-6):
            return None
    return nodes


def _dense_zero_diagonal(matrix: torch.Tensor) -> bool:
    return bool((matrix.diagonal(dim1=-2, dim2=-1) == 0).all())


def adjacency_without_self_loops(matrix: Any, features: Any) -> Propagation | None:
    """The propagation a product of ``matrix`` and ``features`` is, when ``matrix`` is a fixed,
    non-negative node-by-node matrix with an all-zero diagonal (pure)."""
    if not isinstance(matrix, torch.Tensor) or not isinstance(features, torch.Tensor):
        return None
    if matrix.requires_grad or not matrix.is_floating_point() or matrix.dim() not in (2, 3) or features.dim() < 2:
        return None
    nodes = matrix.shape[-1]
    if matrix.shape[-2] != nodes or nodes < MIN_NODES or features.shape[-2] != nodes:
        return None
    if matrix.layout not in (torch.strided, torch.sparse_coo):
        if matrix.dim() != 2:
            return None
        matrix = matrix.to_sparse_coo()  # CSR / CSC: read as COO
    with torch.no_grad():
        if matrix.is_sparse:
            if matrix.dim() != 2:
                return None
            coalesced = matrix.coalesce()
            rows, cols = coalesced.indices()
            values = coalesced.values()
            if bool((values < 0).any()) or bool(((rows == cols) & (values != 0)).any()):
                return None
            nonzero = int((values != 0).sum())
        else:
            if bool((matrix < 0).any()) or not _dense_zero_diagonal(matrix):
                return None
            nonzero = int((matrix != 0).sum())
    rows_total = nodes * (matrix.shape[0] if matrix.dim() == 3 else 1)
    if nonzero < rows_total:  # fewer than one edge per node: not an adjacency in use
        return None
    return Propagation(nodes, nonzero / rows_total)


class PropagationWatch:
    """Feed it every torch function call of the step (``before`` then ``after``)."""

    def __init__(self) -> None:
        self.found: Propagation | None = None
        self.to_source: tuple[int, int] | None = None  # (nodes, edges) of messages scattered to their own end
        self.complete: int | None = None  # nodes of a propagation matrix without a single zero
        self.root_term = False  # a propagated tensor summed or concatenated with an unpropagated one
        self._propagated: list[torch.Tensor] = []
        self._pending = False
        self._gathered: dict[int, list[torch.Tensor]] = {}  # row indices of each length (h[src], h[dst])

    def _is_propagated(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor) and any(kept is value for kept in self._propagated)

    def before(self, name: str, args: tuple) -> None:
        self._pending = False
        if name in GATHERS and len(args) >= 2 and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2:
            index = args[1] if name == "__getitem__" else (args[2] if len(args) >= 3 and args[1] == 0 else None)
            if isinstance(index, torch.Tensor) and index.dim() == 1 and not index.is_floating_point() \
                    and index.dtype != torch.bool and len(self._gathered) < _KEPT:
                kept = self._gathered.setdefault(index.shape[0], [])
                if len(kept) < 8:
                    kept.append(index)
        found = None
        if name in PRODUCTS and len(args) >= 2:
            first, second = (args[1], args[0]) if name == "__rmatmul__" else (args[0], args[1])
            found = adjacency_without_self_loops(first, second)
            if self.complete is None:
                self.complete = complete_adjacency(first, second)
        elif name in SCATTERS and len(args) >= 4:
            found = edge_list_without_self_loops(args[0], args[1], args[2], args[3], self._gathered)
            if self.to_source is None:
                self.to_source = messages_to_source(args[0], args[1], args[2], args[3], self._gathered)
        if found is not None:
            if self.found is None:
                self.found = found
            else:
                self.found.calls += 1
            self._pending = True
            return
        tensors = [a for a in _flat(args) if isinstance(a, torch.Tensor)]
        if not self._propagated or not tensors:
            return
        carried = [t for t in tensors if self._is_propagated(t)]
        if not carried:
            return
        self._pending = True
        if name in COMBINING:
            rows = carried[0].shape[-2] if carried[0].dim() >= 2 else None
            if any(not self._is_propagated(t) and t.dim() >= 2 and t.shape[-2] == rows and t.is_floating_point()
                   for t in tensors):
                self.root_term = True

    def after(self, out: Any) -> None:
        if self._pending and isinstance(out, torch.Tensor) and len(self._propagated) < _KEPT:
            self._propagated.append(out)
        self._pending = False

    def release(self) -> None:
        self._propagated = []
        self._gathered = {}


def _flat(args: Any) -> list[Any]:
    out: list[Any] = []
    for arg in args:
        if isinstance(arg, (list, tuple)):
            out.extend(arg)
        else:
            out.append(arg)
    return out
