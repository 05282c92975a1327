"""Batches of any nesting: one walker for the values inside tuples, lists, dicts (any
Mapping, e.g. Hugging Face's BatchEncoding), namedtuples and dataclass instances.

Every module that looks inside a batch (moving it to the device, counting its samples
or bytes, splitting it into micro-batches, making fake copies for memory estimates)
goes through ``map_batch`` or ``leaves``, so all of them agree on what a batch is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

Leaf = Callable[[Any], bool]


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _is_dataclass_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _rebuild_mapping(value: Mapping, items: dict) -> Any:
    try:
        return type(value)(items)
    except TypeError:  # a Mapping that cannot be built from a dict: a plain dict holds the same
        return items


def map_batch(fn: Callable[[Any], Any], batch: Any, *, is_leaf: Leaf | None = None, plain: bool = False) -> Any:
    """``batch`` with every leaf replaced by ``fn(leaf)``, containers rebuilt as their
    own types (``plain``: as dicts, lists and tuples, e.g. for JSON). A leaf is any value
    that is not a container, or one ``is_leaf`` accepts (a list of one string per sample)."""
    if is_leaf is not None and is_leaf(batch):
        return fn(batch)
    recurse = lambda value: map_batch(fn, value, is_leaf=is_leaf, plain=plain)  # noqa: E731
    if isinstance(batch, Mapping):
        items = {key: recurse(value) for key, value in batch.items()}
        return items if plain else _rebuild_mapping(batch, items)
    if _is_namedtuple(batch):
        values = [recurse(value) for value in batch]
        return tuple(values) if plain else type(batch)(*values)
    if isinstance(batch, (list, tuple)):
        values = [recurse(value) for value in batch]
        return (list(values) if isinstance(batch, list) else tuple(values)) if plain else type(batch)(values)
    if _is_dataclass_instance(batch):
        if plain:
            return {field.name: recurse(getattr(batch, field.name)) for field in dataclasses.fields(batch)}
        changes = {field.name: recurse(getattr(batch, field.name)) for field in dataclasses.fields(batch) if field.init}
        return dataclasses.replace(batch, **changes)
    return fn(batch)


def leaves(batch: Any, *, is_leaf: Leaf | None = None) -> Iterator[Any]:
    """Every leaf of ``batch``, depth first, in the order ``map_batch`` visits them."""
    if is_leaf is not None and is_leaf(batch):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from leaves(value, is_leaf=is_leaf)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from leaves(value, is_leaf=is_leaf)
    elif _is_dataclass_instance(batch):
        for field in dataclasses.fields(batch):
            yield from leaves(getattr(batch, field.name), is_leaf=is_leaf)
    else:
        yield batch


def tensors(batch: Any) -> Iterator[torch.Tensor]:
    return (leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor))


def storages(batch: Any) -> set[int]:
    """The data pointers of the batch's tensors' storages: a tensor is a view of the batch's
    (token ids, an index column) when its storage pointer is among them."""
    # A sparse tensor (a graph's adjacency) has no single storage: it is nobody's view.
    return {leaf.untyped_storage().data_ptr() for leaf in tensors(batch) if leaf.layout == torch.strided}


def batch_size_of(batch: Any) -> int:
    """Number of samples in a batch: the leading dimension of its first tensor (1 for a
    0-dim tensor; 0 when it holds no tensor)."""
    first = next(tensors(batch), None)
    if first is None:
        return 0
    return int(first.shape[0]) if first.dim() > 0 else 1


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    return map_batch(lambda leaf: leaf.to(device, non_blocking=non_blocking) if isinstance(leaf, torch.Tensor) else leaf,
                     batch)
