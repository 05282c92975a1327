"""Gradient reversal on the path of the batch's own labels (``GRADIENT_REVERSED_ON_LABELS``).

A gradient reversal layer (a custom ``torch.autograd.Function`` whose forward is the
identity and whose backward returns ``-alpha * grad``) makes the layers below it *increase*
the loss above it. Domain-adversarial training puts one in front of the domain classifier,
so the shared features learn to hide the domain. Put in front of the label head, it trains
the features to hide the labels the model is meant to predict.

Found from the criteria the loss spy saw: for each criterion's scalar output, the custom
Functions on its graph are called on a random gradient (``node.apply``); one that returns a
negative multiple of it is a reversal. The labels are the batch's conventional label field
(``batch[1]`` of a tuple, ``labels``/``label``/``y``/``target(s)`` of a dict), a criterion's
target when it is a view of that tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

MAX_NODES = 20_000  # a graph walk bound for very deep models
LABEL_KEYS = ("labels", "label", "y", "target", "targets")


@dataclass(frozen=True)
class Reversal:
    function: str  # the custom autograd Function's class name
    factor: float  # its backward's multiple of the incoming gradient (negative)
    criterion: str
    on_labels: bool  # the criterion's target is the batch's label field
    others_unreversed: bool  # another criterion of the step reaches the model without a reversal


def label_field(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, (tuple, list)) and len(batch) >= 2 and isinstance(batch[1], torch.Tensor):
        return batch[1]
    if isinstance(batch, dict):
        return next((batch[key] for key in LABEL_KEYS if isinstance(batch.get(key), torch.Tensor)), None)
    return None


def reversal_factor(node: Any) -> float | None:
    """The negative factor a custom Function's backward scales its gradient by; None when it
    is not a pure negative scaling (or cannot be called on its own)."""
    cls = getattr(node, "_forward_cls", None)
    # Calling a backward runs user code: only one that keeps no tensors is called. A
    # reversal needs none, and torch's own Functions (a reentrant checkpoint, which runs a
    # whole backward into the parameters' .grad) are never called.
    if cls is None or cls.__module__.split(".")[0] == "torch":
        return None
    try:
        if node.saved_tensors:
            return None
    except RuntimeError:  # saved tensors already freed
        return None
    metadata = getattr(node, "_input_metadata", None)
    if not metadata or len(metadata) != 1 or not metadata[0].dtype.is_floating_point:
        return None
    meta = metadata[0]
    grad = torch.randn(tuple(meta.shape), generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    grad = grad.to(device=meta.device, dtype=meta.dtype)
    try:
        with torch.no_grad():
            out = node.apply(grad)
    except Exception:  # a backward that needs more than its saved state: judge nothing
        return None
    first = out[0] if isinstance(out, tuple) and out else out
    if not isinstance(first, torch.Tensor) or first.shape != grad.shape or not bool(grad.any()):
        return None
    factor = float((first.float() * grad.float()).sum() / (grad.float() ** 2).sum())
    if factor >= 0 or not torch.allclose(first.float(), factor * grad.float(), rtol=1e-3, atol=1e-6):
        return None
    return factor


def reversals_on(output: torch.Tensor) -> list[tuple[str, float]]:
    """(Function class, factor) of the gradient reversals on ``output``'s graph."""
    found: list[tuple[str, float]] = []
    start = output.grad_fn
    if start is None:
        return found
    seen: set[int] = set()
    held = []  # held while walking, so no freed node's id is reused by another
    stack = [start]
    while stack and len(seen) < MAX_NODES:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        held.append(node)
        cls = getattr(node, "_forward_cls", None)
        if cls is not None:
            factor = reversal_factor(node)
            if factor is not None:
                found.append((cls.__name__, factor))
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def find_reversals(outputs: list[torch.Tensor], sources: list[tuple[str, Any]], batch: Any) -> list[Reversal]:
    """``outputs``: the criteria's scalar outputs of one step; ``sources``: (criterion name,
    target) of each, in the same order; ``batch``: what compute_loss received."""
    labels = label_field(batch)
    label_storage = labels.untyped_storage().data_ptr() \
        if labels is not None and labels.layout == torch.strided else None
    per_output = [reversals_on(output) for output in outputs]
    reversed_count = sum(bool(found) for found in per_output)
    result = []
    for found, (criterion, target) in zip(per_output, sources):
        if not found:
            continue
        on_labels = (label_storage is not None and isinstance(target, torch.Tensor)
                     and target.untyped_storage().data_ptr() == label_storage)
        function, factor = found[0]
        result.append(Reversal(function, factor, criterion, on_labels, reversed_count < len(outputs)))
    return result
