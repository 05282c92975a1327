"""A per-sample coefficient broadcast along the features (pure watch over a step's calls).

A diffusion loss scales each sample by its noise level: ``ab = alphas_cumprod[t]`` has one
value per sample, shape ``(B,)``, and must become ``(B, 1)`` before it meets ``x0`` of shape
``(B, D)``. Without ``[:, None]`` broadcasting aligns ``(B,)`` with the last axis: an error,
unless ``D == B``, when each feature column gets another sample's coefficient and nothing
warns. The same holds for any per-sample weight, mask or scale read from a table by a
per-sample index.

Followed through the step's torch calls: a 1-D table indexed by a 1-D integer tensor of the
batch's length gives a per-sample vector; elementwise functions of it (``sqrt``, ``1 - ab``,
``log``, a scalar factor) stay per-sample; such a vector combined with a ``(B, B)`` tensor by
arithmetic is the finding (a ``(B, B)`` table of pairs scaled per row is written with
``[:, None]`` too, so it is not met here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

UNARY = frozenset({"sqrt", "rsqrt", "exp", "log", "log1p", "neg", "__neg__", "reciprocal", "sigmoid", "tanh", "abs",
                   "clamp", "clip", "pow", "__pow__", "float", "to", "type_as", "contiguous"})
SCALAR_ARITHMETIC = frozenset({"sub", "__sub__", "__rsub__", "rsub", "add", "__add__", "__radd__", "mul", "__mul__",
                               "__rmul__", "div", "__truediv__", "__rtruediv__", "true_divide"})
_KEPT = 64


@dataclass
class PerSampleBroadcast:
    op: str
    coefficient: tuple[int, ...]  # (B,)
    other: tuple[int, ...]  # (B, B)


class PerSampleWatch:
    """Feed it every torch call of the step (``before`` then ``after``) and the batch's length."""

    def __init__(self) -> None:
        self.found: PerSampleBroadcast | None = None
        self.rows = 0
        self._vectors: list[torch.Tensor] = []
        self._pending = False

    def _is_vector(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor) and any(kept is value for kept in self._vectors)

    def before(self, name: str, args: tuple) -> None:
        self._pending = False
        if self.found is not None or self.rows < 2 or not args:
            return
        first = args[0]
        if name == "__getitem__" and len(args) >= 2 and isinstance(first, torch.Tensor) and first.dim() == 1:
            index = args[1]
            self._pending = (isinstance(index, torch.Tensor) and index.dim() == 1 and index.shape[0] == self.rows
                             and not index.is_floating_point() and index.dtype != torch.bool)
            return
        tensors = [a for a in args[:2] if isinstance(a, torch.Tensor)]
        carried = [t for t in tensors if self._is_vector(t)]
        if not carried:
            return
        if name in UNARY:
            self._pending = True
        elif name in SCALAR_ARITHMETIC:
            others = [t for t in tensors if not self._is_vector(t)]
            if not others or all(t.dim() == 0 for t in others):
                self._pending = True  # 1 - ab, 0.5 * ab: still one value per sample
            elif any(t.dim() == 2 and tuple(t.shape) == (self.rows, self.rows) for t in others):
                self.found = PerSampleBroadcast(name.strip("_"), (self.rows,), (self.rows, self.rows))

    def after(self, out: Any) -> None:
        if self._pending and isinstance(out, torch.Tensor) and out.dim() == 1 and len(self._vectors) < _KEPT:
            self._vectors.append(out)
        self._pending = False

    def release(self) -> None:
        self._vectors = []
