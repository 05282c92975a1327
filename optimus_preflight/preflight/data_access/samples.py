"""Views of a batch's samples for the data checks: bytes, shapes, per-sample digests,
and splitting into (or joining) micro-batches. The walking is ``training.batches``."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from optimus_preflight.training.batches import batch_size_of, leaves, map_batch


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

    def describe(leaf: Any) -> str:
        if isinstance(leaf, torch.Tensor):
            return f"tensor{tuple(leaf.shape)}"
        if isinstance(leaf, np.ndarray):
            return f"array{tuple(leaf.shape)}"
        return type(leaf).__name__

    return map_batch(describe, sample, plain=True)


def leaf_shapes(sample: Any) -> tuple:
    """Shapes of a sample's tensors/arrays, in order: what default collate must stack."""
    return tuple(tuple(leaf.shape) for leaf in leaves(sample) if isinstance(leaf, (torch.Tensor, np.ndarray)))


def per_sample_values(size: int) -> Callable[[Any], bool]:
    """``is_leaf`` for the walker: a list or tuple of ``size`` plain values (one string
    or id per sample) is one field of the batch, not a container of fields."""

    def is_leaf(value: Any) -> bool:
        return (isinstance(value, (list, tuple)) and not hasattr(value, "_fields") and len(value) == size
                and not any(isinstance(item, (Mapping, list, tuple, torch.Tensor, np.ndarray)) for item in value))

    return is_leaf


def _has_batch_dim(leaf: Any, size: int) -> bool:
    return isinstance(leaf, (torch.Tensor, np.ndarray)) and leaf.ndim > 0 and leaf.shape[0] == size


def _leaf_rows(leaf: Any, size: int) -> list[bytes] | None:
    """Per-sample bytes of one field of a batch, or None where it has no batch dimension."""
    if isinstance(leaf, torch.Tensor) and _has_batch_dim(leaf, size):
        if leaf.layout != torch.strided:  # a sparse adjacency: its rows, read dense
            leaf = leaf.detach().to("cpu").to_dense()
        flat = leaf.detach().to("cpu").contiguous().reshape(size, -1)
        if flat.dtype == torch.bfloat16:  # numpy has no bfloat16
            flat = flat.view(torch.int16)
        array = flat.numpy()
        return [array[index].tobytes() for index in range(size)]
    if isinstance(leaf, np.ndarray) and _has_batch_dim(leaf, size):
        return [np.ascontiguousarray(leaf[index]).tobytes() for index in range(size)]
    if per_sample_values(size)(leaf):
        return [repr(value).encode() for value in leaf]
    return None


def input_digests(batch: Any) -> list[str]:
    """One digest per sample of the batch's largest field alone (the inputs: the image, the
    token ids, the feature row), the one with the most distinct rows among equally large
    ones (input_ids over an attention mask of ones); [] without per-sample fields."""
    size = batch_size_of(batch)
    # Sized by values, not bytes: an int64 (B, H, W) mask is not larger than the float32 (B, 1, H, W) image.
    fields = [(_values_per_row(leaf, size), rows) for leaf in leaves(batch, is_leaf=per_sample_values(size))
              if (rows := _leaf_rows(leaf, size)) is not None and size > 0]
    if not fields:
        return []
    largest = max(values for values, _ in fields)
    candidates = [[hashlib.blake2b(row, digest_size=12).hexdigest() for row in rows]
                  for values, rows in fields if values == largest]
    return max(candidates, key=lambda digests: len(set(digests)))


def _values_per_row(leaf: Any, size: int) -> int:
    count = getattr(leaf, "numel", None)
    if callable(count):
        return count() // max(size, 1)
    shape = getattr(leaf, "shape", None)
    return int(math.prod(shape)) // max(size, 1) if shape is not None else 1


def sample_hashes(batch: Any) -> list[str]:
    """One digest per sample (row along the batch dimension) over all of its values."""
    size = batch_size_of(batch)
    if size == 0 and isinstance(batch, (list, tuple)):
        size = len(batch)
    fields = [rows for rows in (_leaf_rows(leaf, size) for leaf in leaves(batch, is_leaf=per_sample_values(size)))
              if rows is not None]
    if not fields:
        return []
    return [hashlib.blake2b(b"|".join(rows[index] for rows in fields), digest_size=12).hexdigest() for index in range(size)]


def sample_digest(sample: Any) -> str:
    """A digest of one sample's values (not of its identity): tensors and arrays by dtype,
    shape and bytes, images (PIL) by mode, size and bytes, anything else (a sparse tensor
    too) by its repr. Equal samples read twice, or from two datasets, digest equal."""
    digest = hashlib.blake2b(digest_size=12)
    for leaf in leaves(sample):
        if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided:
            values = leaf.detach().cpu().contiguous()
            if values.dtype == torch.bfloat16:  # numpy has no bfloat16
                values = values.view(torch.int16)
            leaf = values.numpy()
        if isinstance(leaf, np.ndarray):
            digest.update(f"{leaf.dtype}{leaf.shape}".encode() + np.ascontiguousarray(leaf).tobytes())
        elif hasattr(leaf, "tobytes") and hasattr(leaf, "mode"):
            digest.update(f"{leaf.mode}{leaf.size}".encode() + leaf.tobytes())
        else:
            digest.update(repr(leaf).encode())
        digest.update(b"|")
    return digest.hexdigest()


def split_batch(batch: Any, parts: int) -> list[Any]:
    """Split along the batch dimension into ``parts`` micro-batches (sizes differ by <= 1)."""
    size = batch_size_of(batch)
    if size < parts:
        raise ValueError(f"cannot split a batch of {size} samples into {parts} micro-batches")
    bounds = torch.tensor_split(torch.arange(size), parts)
    return [_take(batch, int(chunk[0]), int(chunk[-1]) + 1, size) for chunk in bounds]


def _take(batch: Any, start: int, stop: int, size: int) -> Any:
    def take(leaf: Any) -> Any:
        return leaf[start:stop] if _has_batch_dim(leaf, size) or per_sample_values(size)(leaf) else leaf

    return map_batch(take, batch, is_leaf=per_sample_values(size))


def concat_batches(batches: list[Any]) -> Any:
    """One batch holding the samples of ``batches`` (same structure), in order: the
    inverse of ``split_batch``. Values without a batch dimension are taken from the first."""
    first = batches[0]
    if len(batches) == 1:
        return first
    size = batch_size_of(first)
    columns = zip(*(list(leaves(batch, is_leaf=per_sample_values(batch_size_of(batch)))) for batch in batches))

    def join(column: tuple) -> Any:
        head = column[0]
        if isinstance(head, torch.Tensor) and _has_batch_dim(head, size):
            return torch.cat(column)
        if per_sample_values(size)(head):
            return type(head)(value for part in column for value in part)
        return head

    joined = iter([join(column) for column in columns])
    return map_batch(lambda _: next(joined), first, is_leaf=per_sample_values(size))


def ordered_loader(loader: Any, batch_size: int = 256) -> Any:
    """A loader over ``loader``'s map-style dataset in index order, with its collate and no
    workers: what a check reads to see how the Dataset itself lays the samples out."""
    from torch.utils.data import DataLoader

    return DataLoader(loader.dataset, batch_size=batch_size, shuffle=False, num_workers=0,
                      collate_fn=getattr(loader, "collate_fn", None))
