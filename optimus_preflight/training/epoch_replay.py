"""Replaying an epoch's order on resume, for any DataLoader.

A ``DataLoader(shuffle=True)`` fixes an epoch's order when its iterator starts: the
iterator draws a base seed (for the workers) from ``loader.generator`` or torch's
global RNG, then the sampler draws its own seed from its generator or the global RNG.
Where those RNGs stand at that moment depends on everything that ran before (model
init, dropout, the previous epoch), which a checkpoint taken mid-epoch cannot
reconstruct. So the stream records, when it starts an epoch, the state of every RNG
that can decide the order (``capture_order``) and keeps it in the checkpoint; a
resumed run sets those states back for the moment its iterator starts
(``order_replayed``), so the draws repeat exactly, and then puts the global RNGs back
where the checkpoint left them.

The consumed part of the epoch is skipped by index where the loader allows it
(``seekable_view``): the view's sampler drops the first indices, so no sample of the
consumed part is loaded. Samplers with ``set_start`` seek on their own; an
IterableDataset or an object that is not a DataLoader is skipped by reading.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from optimus_preflight.training import rng

# Where private generators may sit; RandomSampler, SubsetRandomSampler and
# WeightedRandomSampler keep theirs as ``generator``, a custom batch sampler (P classes x K
# samples) wherever it likes. A plain loader's sampler is its batch_sampler's sampler too:
# that path comes first, so its generator keeps the name checkpoints already hold.
_OWNERS = ("loader", "batch_sampler.sampler", "sampler", "batch_sampler")


def _owner(loader: Any, path: str) -> Any:
    obj = loader
    for part in path.split(".")[1:]:
        obj = getattr(obj, part, None)
    return obj


def order_generators(loader: Any) -> dict[str, torch.Generator]:
    """The torch.Generators a loader and its samplers hold, by a stable name."""
    found: dict[str, torch.Generator] = {}
    seen: set[int] = set()
    for path in _OWNERS:
        owner = loader if path == "loader" else _owner(loader, f"loader.{path}")
        if owner is None or not hasattr(owner, "__dict__"):
            continue
        for name, value in vars(owner).items():
            if isinstance(value, torch.Generator) and id(value) not in seen:
                seen.add(id(value))
                found[f"{path}.{name}"] = value
    return found


def _global_state() -> dict[str, Any]:
    # Samplers draw on the CPU; the CUDA RNG never decides an order.
    return {**rng.capture(), "torch_cuda": []}


def capture_order(loader: Any) -> dict[str, Any]:
    """The RNG states that decide the order of the epoch about to start, in types
    ``torch.load(weights_only=True)`` accepts."""
    return {
        "rng": rng.to_checkpoint(_global_state()),
        "generators": {name: generator.get_state() for name, generator in order_generators(loader).items()},
    }


@contextlib.contextmanager
def order_replayed(loader: Any, order: dict[str, Any] | None) -> Iterator[None]:
    """Within the block every order-deciding RNG is as ``order`` recorded it.

    Afterwards the global RNGs return to where they were (the checkpoint's boundary
    state, which already includes these draws); the loader's own generators keep the
    state the replayed draws leave, exactly as in the run that recorded ``order``.
    """
    if order is None:
        yield
        return
    current = order_generators(loader)
    for name in set(order["generators"]) - set(current):
        # Checkpoints before batch samplers' own generators were recorded named the loader's
        # sampler 'batch_sampler.sampler' even where the loader batches nothing (batch_size=None).
        alias = name.replace("batch_sampler.sampler.", "sampler.", 1)
        if alias in current:
            current[name] = current[alias]
    missing = set(order["generators"]) - set(current)
    if missing:
        raise ValueError(f"the loader no longer holds the generators {sorted(missing)} that decided the epoch's order")
    boundary = rng.capture()
    rng.restore(rng.from_checkpoint(order["rng"]))  # no CUDA state in it: CUDA stays untouched
    for name, state in order["generators"].items():
        current[name].set_state(state)
    try:
        yield
    finally:
        rng.restore(boundary)


class _SkipFirst:
    """A sampler view whose iteration drops the first ``skip`` items of ``inner``."""

    def __init__(self, inner: Iterable[Any], skip: int):
        self.inner = inner
        self.skip = skip

    def __len__(self) -> int:
        return max(len(self.inner) - self.skip, 0)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.inner), self.skip, None)


class _Primable:
    """The outermost index sampler of a view. ``prime()`` makes its iterator take its
    first item now, so a sampler that draws its seed lazily (RandomSampler draws at its
    first item) does so while the recorded RNG states are in place."""

    def __init__(self, inner: Iterable[Any]):
        self.inner = inner
        self.iterator: _PrimedIterator | None = None

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __iter__(self) -> _PrimedIterator:
        self.iterator = _PrimedIterator(iter(self.inner))
        return self.iterator

    def prime(self) -> None:
        if self.iterator is not None:
            self.iterator.prime()


class _PrimedIterator:
    _END = object()

    def __init__(self, source: Iterator[Any]):
        self.source = source
        self.buffer: list[Any] = []

    def prime(self) -> None:
        if not self.buffer:
            self.buffer.append(next(self.source, self._END))

    def __iter__(self) -> _PrimedIterator:
        return self

    def __next__(self) -> Any:
        item = self.buffer.pop() if self.buffer else next(self.source)
        if item is self._END:
            raise StopIteration
        return item


def can_skip_by_index(loader: Any) -> bool:
    """A torch DataLoader over a map-style dataset: its samplers yield indices."""
    return isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset)


def seekable_view(loader: DataLoader, skip_samples: int, batch_size: int) -> tuple[DataLoader, _Primable]:
    """A shallow copy of ``loader`` whose index sampler skips the consumed part.

    With the standard BatchSampler the skip is by samples (a resume may change the
    batch size); a custom batch sampler is skipped by whole batches of the stream's
    count (``skip_samples // batch_size``). Workers, collate_fn, pinning and the
    generator are the loader's own.
    """
    view = copy.copy(loader)  # restores __dict__ directly: DataLoader's __setattr__ guard is not involved
    view.__dict__["_iterator"] = None
    batch_sampler = loader.batch_sampler
    if batch_sampler is None:  # no automatic batching: the sampler yields what the dataset is indexed by
        primable = _Primable(_SkipFirst(loader.sampler, skip_samples))
        view.__dict__["sampler"] = primable
    elif type(batch_sampler) is BatchSampler:
        inner = BatchSampler(_SkipFirst(batch_sampler.sampler, skip_samples), batch_sampler.batch_size,
                             batch_sampler.drop_last)
        primable = _Primable(inner)
        view.__dict__["batch_sampler"] = primable
    else:
        primable = _Primable(_SkipFirst(batch_sampler, skip_samples // max(batch_size, 1)))
        view.__dict__["batch_sampler"] = primable
    return view, primable


_TORCH_SAMPLERS = (
    "torch.utils.data.sampler.SequentialSampler",
    "torch.utils.data.sampler.RandomSampler",
    "torch.utils.data.sampler.SubsetRandomSampler",
    "torch.utils.data.sampler.WeightedRandomSampler",
    "torch.utils.data.sampler.BatchSampler",
    "torch.utils.data.distributed.DistributedSampler",
)


def _qualified(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def custom_samplers(loader: DataLoader) -> list[Any]:
    """The loader's samplers that are not torch's own. torch's draw their order only
    from their ``generator`` or torch's global RNG (or from seed + epoch), which
    ``capture_order`` records; anything else must be shown to replay."""
    found = []
    for path in ("sampler", "batch_sampler", "batch_sampler.sampler"):
        owner = _owner(loader, f"loader.{path}")
        if owner is not None and _qualified(owner) not in _TORCH_SAMPLERS and not hasattr(owner, "set_start"):
            found.append(owner)
    return found


def first_index_batches(loader: DataLoader, order: dict[str, Any], count: int) -> list[Any]:
    """The first ``count`` items of the loader's index sampler, drawn as a replayed
    epoch start draws them (the iterator's base-seed draw first, then the sampler's)."""
    with order_replayed(loader, order):
        torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        return list(itertools.islice(iter(loader._index_sampler), count))
