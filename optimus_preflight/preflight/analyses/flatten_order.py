"""Predictions and targets flattened from their leading axes in different orders.

A sequence model that returns seq-first ``(T, B, C)`` logits (``nn.TransformerEncoder`` and
``nn.LSTM`` without ``batch_first``) flattened with ``reshape(-1, C)`` against batch-first
``(B, T)`` tags flattened with ``reshape(-1)``: both have ``T * B`` rows, so the criterion
accepts them, but row ``i`` of the logits is position ``i // B`` of sample ``i % B`` while
row ``i`` of the targets is position ``i % T`` of sample ``i // T``. Every token is scored
against another token's label. Read from what the criterion gets: the shape each tensor is
a flattened view of (its ``_base``, or the sizes its reshape's backward saved).

The same read finds channels-first class scores, ``(N, C, H, W)`` segmentation logits (or
``(B, C, T)`` from a Conv1d), flattened with ``view(-1, C)`` without moving the class axis
last: each row then holds C neighbouring values of one class's map, not one pixel's scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

RESHAPE_BACKWARDS = ("ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0")


@dataclass
class FlattenMismatch:
    function: str
    prediction_axes: tuple[int, ...]  # the leading axes flattened into the criterion's rows
    target_axes: tuple[int, ...]
    class_axis: tuple[int, ...] | None = None  # the channels-first shape whose class axis was viewed as last
    stacked_dim: int | None = None  # the predictions are torch.stack(per-step outputs, dim=this)


FLATTENING_CALLS = ("reshape", "view", "flatten", "ravel")
_KEPT = 32


class FlattenWatch:
    """The shape each tensor was flattened from, by the reshape/view/flatten call that made it.
    A view's ``_base`` is the root of the storage, not the tensor just flattened: the targets
    of a BPTT batch sliced from a long stream have the whole stream as their base."""

    def __init__(self) -> None:
        self._made: list[tuple[torch.Tensor, tuple[int, ...]]] = []  # held for the step only

    def observe(self, name: str, args: tuple, out: object) -> None:
        if not args or not isinstance(args[0], torch.Tensor) or not isinstance(out, torch.Tensor):
            return
        if name not in FLATTENING_CALLS:
            # A shape-keeping op on a flattened tensor (softmax / T, log_softmax): its rows are
            # still the rows of what was flattened (a teacher's soft targets in a distillation).
            if out.shape == args[0].shape and out is not args[0] and (source := self.source(args[0])) is not None:
                self._made.append((out, source))
                del self._made[:-_KEPT]
            return
        if out.dim() >= args[0].dim():
            return
        self._made.append((out, tuple(args[0].shape)))
        del self._made[:-_KEPT]

    def source(self, tensor: torch.Tensor) -> tuple[int, ...] | None:
        return next((shape for made, shape in reversed(self._made) if made is tensor), None)


def flattened_from(tensor: torch.Tensor, watch: FlattenWatch | None = None) -> tuple[int, ...] | None:
    """The shape ``tensor`` is a flattened view or reshape of, where that is known."""
    if watch is not None and (shape := watch.source(tensor)) is not None:
        return shape
    base = tensor._base
    if base is not None and base.dim() > tensor.dim():
        return tuple(base.shape)
    node = tensor.grad_fn
    if node is not None and type(node).__name__ in RESHAPE_BACKWARDS:
        sizes = getattr(node, "_saved_self_sym_sizes", None)
        if sizes is not None and len(sizes) > tensor.dim():
            return tuple(int(size) for size in sizes)
    return None


def stacked_along(tensor: torch.Tensor) -> int | None:
    """The dim of the torch.stack that built the tensor ``tensor`` was flattened from (through
    views, reshapes and copies), or None."""
    node = tensor.grad_fn
    for _ in range(6):
        if node is None:
            return None
        name = type(node).__name__
        if name == "StackBackward0":
            return int(getattr(node, "_saved_dim", 0))
        if name not in (*RESHAPE_BACKWARDS, "CloneBackward0", "ToCopyBackward0") or not node.next_functions:
            return None
        node = node.next_functions[0][0]
    return None


def leading_axes(shape: tuple[int, ...], rows: int) -> tuple[int, ...] | None:
    """The first axes of ``shape`` whose product is ``rows`` (pure)."""
    product = 1
    for count, size in enumerate(shape, start=1):
        product *= size
        if product == rows:
            return shape[:count]
        if product > rows:
            return None
    return None


def class_axis_viewed_last(inputs: torch.Tensor) -> tuple[int, ...] | None:
    """The channels-first shape (N, C, ...) that (rows, C) class scores are a plain view or
    reshape of, its class axis not moved last: view(-1, C) of (N, C, H, W) segmentation logits
    fills each row with C neighbouring pixels of one class's map (pure)."""
    source = flattened_from(inputs)
    if inputs.dim() != 2 or source is None or len(source) < 3:
        return None
    classes = inputs.shape[1]
    if source[1] == classes and source[-1] != classes and classes >= 2:
        return source
    return None


def flatten_mismatch(function: str, inputs: object, target: object,
                     watch: FlattenWatch | None = None) -> FlattenMismatch | None:
    """The criterion's rows flattened from (T, B) on one side and (B, T) on the other, or class
    scores viewed from a channels-first tensor without moving the class axis last."""
    if not (isinstance(inputs, torch.Tensor) and isinstance(target, torch.Tensor)) or inputs.dim() == 0 \
            or target.dim() == 0 or inputs.shape[0] != target.shape[0]:
        return None
    rows = inputs.shape[0]
    if not target.is_floating_point() and (channels_first := class_axis_viewed_last(inputs)) is not None:
        return FlattenMismatch(function, (rows,), tuple(target.shape), channels_first)
    sources = flattened_from(inputs, watch), flattened_from(target, watch)
    if sources[0] is None or sources[1] is None:
        return None
    prediction, labels = (leading_axes(source, rows) for source in sources)
    if prediction is None or labels is None:
        return None
    kept_prediction, kept_labels = [s for s in prediction if s != 1], [s for s in labels if s != 1]
    if len(kept_prediction) < 2 or kept_prediction == kept_labels or sorted(kept_prediction) != sorted(kept_labels):
        return None
    return FlattenMismatch(function, prediction, labels, stacked_dim=stacked_along(inputs))
