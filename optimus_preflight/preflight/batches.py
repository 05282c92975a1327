"""Pure helpers over batches of any nested structure (tensors in dicts, lists, tuples)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from optimus_preflight.data import batch_size_of


def leaves(batch: Any) -> Iterator[Any]:
    """Every non-container value, depth first (dict values in insertion order)."""
    if isinstance(batch, dict):
        for value in batch.values():
            yield from leaves(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from leaves(value)
    else:
        yield batch


def batch_nbytes(batch: Any) -> int:
    """Bytes held by the tensors and arrays of a batch (strings and numbers count their size)."""
    total = 0
    for leaf in leaves(batch):
        if isinstance(leaf, torch.Tensor):
            total += leaf.numel() * leaf.element_size()
        elif isinstance(leaf, np.ndarray):
            total += leaf.nbytes
        elif isinstance(leaf, (bytes, str)):
            total += len(leaf)
        elif isinstance(leaf, (int, float, bool)):
            total += 8
    return total


def describe_shapes(sample: Any) -> Any:
    """A readable structure of shapes: ``(tensor(32,), tensor(32,))``."""
    if isinstance(sample, torch.Tensor):
        return f"tensor{tuple(sample.shape)}"
    if isinstance(sample, np.ndarray):
        return f"array{tuple(sample.shape)}"
    if isinstance(sample, dict):
        return {key: describe_shapes(value) for key, value in sample.items()}
    if isinstance(sample, (list, tuple)):
        items = [describe_shapes(value) for value in sample]
        return items if isinstance(sample, list) else tuple(items)
    return type(sample).__name__


def leaf_shapes(sample: Any) -> tuple:
    """Shapes of a sample's tensors/arrays, in order: what default collate must stack."""
    return tuple(tuple(leaf.shape) for leaf in leaves(sample) if isinstance(leaf, (torch.Tensor, np.ndarray)))


def _is_container(value: Any) -> bool:
    return isinstance(value, (dict, list, tuple, torch.Tensor, np.ndarray))


def _rows(node: Any, size: int) -> list[bytes] | None:
    """Per-sample bytes of one node of a batch, or None where it has no batch dimension."""
    if isinstance(node, torch.Tensor):
        if node.dim() == 0 or node.shape[0] != size:
            return None
        flat = node.detach().to("cpu").contiguous().reshape(size, -1)
        if flat.dtype == torch.bfloat16:  # numpy has no bfloat16
            flat = flat.view(torch.int16)
        array = flat.numpy()
        return [array[index].tobytes() for index in range(size)]
    if isinstance(node, np.ndarray):
        if node.ndim == 0 or node.shape[0] != size:
            return None
        return [np.ascontiguousarray(node[index]).tobytes() for index in range(size)]
    if isinstance(node, (list, tuple)) and len(node) == size and not any(_is_container(v) for v in node):
        return [repr(value).encode() for value in node]  # e.g. a list of strings, one per sample
    children = node.values() if isinstance(node, dict) else node if isinstance(node, (list, tuple)) else ()
    parts = [rows for rows in (_rows(child, size) for child in children) if rows is not None]
    if not parts:
        return None
    return [b"|".join(part[index] for part in parts) for index in range(size)]


def sample_hashes(batch: Any) -> list[str]:
    """One digest per sample (row along the batch dimension) over all of its values."""
    size = batch_size_of(batch)
    if size == 0 and isinstance(batch, (list, tuple)):
        size = len(batch)
    rows = _rows(batch, size) or []
    return [hashlib.blake2b(row, digest_size=12).hexdigest() for row in rows]


def split_batch(batch: Any, parts: int) -> list[Any]:
    """Split along the batch dimension into ``parts`` micro-batches (sizes differ by <= 1)."""
    size = batch_size_of(batch)
    if size < parts:
        raise ValueError(f"cannot split a batch of {size} samples into {parts} micro-batches")
    bounds = torch.tensor_split(torch.arange(size), parts)
    return [_take(batch, int(chunk[0]), int(chunk[-1]) + 1, size) for chunk in bounds]


def _take(batch: Any, start: int, stop: int, size: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.dim() > 0 and batch.shape[0] == size else batch
    if isinstance(batch, dict):
        return type(batch)((key, _take(value, start, stop, size)) for key, value in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_take(value, start, stop, size) for value in batch))
    if isinstance(batch, (list, tuple)):
        if len(batch) == size and not any(isinstance(v, (torch.Tensor, dict, list, tuple)) for v in batch):
            return type(batch)(batch[start:stop])
        return type(batch)(_take(value, start, stop, size) for value in batch)
    return batch


def concat_batches(batches: list[Any]) -> Any:
    """One batch holding the samples of ``batches`` (same structure), in order: the
    inverse of ``split_batch``. Values without a batch dimension are taken from the first."""
    first = batches[0]
    if len(batches) == 1:
        return first
    size = batch_size_of(first)
    if isinstance(first, torch.Tensor):
        return torch.cat(batches) if first.dim() > 0 and first.shape[0] == size else first
    if isinstance(first, dict):
        return type(first)((key, concat_batches([b[key] for b in batches])) for key in first)
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(concat_batches(list(parts)) for parts in zip(*batches)))
    if isinstance(first, (list, tuple)):
        if len(first) == size and not any(isinstance(v, (torch.Tensor, dict, list, tuple)) for v in first):
            return type(first)(value for batch in batches for value in batch)  # e.g. one string per sample
        return type(first)(concat_batches(list(parts)) for parts in zip(*batches))
    return first
