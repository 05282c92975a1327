"""Live tensor-storage accounting: the peak of the bytes held by every live storage.

``StorageTracker`` is a ``TorchDispatchMode``: every op's outputs pass through it, and
each storage not seen before is counted until its Python object dies (PyTorch keeps a
storage's Python object alive exactly as long as the C++ storage, so a weakref callback
marks the free). Views share their base's storage, so they cost nothing. The same
tracker runs over fake tensors (the estimate) and real tensors (the measurement), which
is what makes the two comparable.

Categories are assigned when a storage appears (from the phase the runner is in) and
refined later: a backward output that becomes a ``.grad`` is re-labelled ``grads``,
a tensor the optimizer keeps is re-labelled ``optimizer_state``. Re-labelling also
fixes the breakdown recorded at the peak when the storage was already alive then, so
the breakdown at the peak is exact without snapshotting every storage at every step.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Fine-grained categories and the report key (params, grads, optimizer_state, activations, other) each one is reported under.
REPORT_KEY = {
    "params": "params",
    "grads": "grads",
    "optimizer_state": "optimizer_state",
    "activations": "activations",
    "buffers": "other",
    "inputs": "other",
    "backward_temporaries": "other",
    "optimizer_temporaries": "other",
    "other": "other",
}
REPORT_KEYS = ("params", "grads", "optimizer_state", "activations", "other")


@dataclass
class _Entry:
    nbytes: int
    category: str
    seq: int
    ref: Any


class StorageTracker(TorchDispatchMode):
    """Counts live storage bytes by category and records the peak with its breakdown.

    ``round_bytes`` maps a storage's size to what the allocator really hands out (the
    CUDA caching allocator rounds up); ``on_alloc``/``on_free`` let an allocator model
    replay the same stream of allocations.
    """

    def __init__(
        self,
        round_bytes: Callable[[int], int] | None = None,
        on_alloc: Callable[[int, int], None] | None = None,
        on_free: Callable[[int], None] | None = None,
    ):
        super().__init__()
        self.round_bytes = round_bytes or (lambda nbytes: nbytes)
        self.on_alloc = on_alloc
        self.on_free = on_free
        self.phase = "other"
        self.where = "setup"
        self.entries: dict[int, _Entry] = {}
        self.totals: dict[str, int] = defaultdict(int)
        self.current = 0
        self.seq = 0
        self.peak = 0
        self.peak_totals: dict[str, int] = {}
        self.peak_seq = 0
        self.peak_where = "setup"

    # ------------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self._add(out, self.phase)
        elif isinstance(out, (tuple, list)):
            for item in out:
                if isinstance(item, torch.Tensor):
                    self._add(item, self.phase)
                elif isinstance(item, (tuple, list)):  # foreach ops return lists
                    for inner in item:
                        if isinstance(inner, torch.Tensor):
                            self._add(inner, self.phase)
        return out

    # -------------------------------------------------------------------- public
    def track(self, tensors: Iterable[Any] | torch.Tensor, category: str) -> None:
        """Count tensors created outside the tracker (a real model's weights, a batch)."""
        for tensor in _tensors(tensors):
            self._add(tensor, category)

    def relabel(self, tensors: Iterable[Any] | torch.Tensor, category: str) -> None:
        """Move already counted storages to ``category`` (now and in the peak's breakdown)."""
        for tensor in _tensors(tensors):
            entry = self.entries.get(_storage_key(tensor))
            if entry is None:
                self._add(tensor, category)
                continue
            if entry.category == category:
                continue
            self.totals[entry.category] -= entry.nbytes
            self.totals[category] += entry.nbytes
            if entry.seq <= self.peak_seq:  # alive at the peak (it is alive now and was then)
                self.peak_totals[entry.category] = self.peak_totals.get(entry.category, 0) - entry.nbytes
                self.peak_totals[category] = self.peak_totals.get(category, 0) + entry.nbytes
            entry.category = category

    def reset_peak(self) -> None:
        """Start the peak from what is live now (model construction is not a step)."""
        self.peak = self.current
        self.peak_totals = dict(self.totals)
        self.peak_seq = self.seq
        self.peak_where = self.where

    def live_bytes(self, category: str | None = None) -> int:
        return self.current if category is None else self.totals.get(category, 0)

    def peak_breakdown(self) -> dict[str, int]:
        """The peak's bytes under the report keys (params, grads, optimizer_state, activations, other)."""
        report = {key: 0 for key in REPORT_KEYS}
        for category, nbytes in self.peak_totals.items():
            report[REPORT_KEY.get(category, "other")] += nbytes
        return report

    def peak_detail(self) -> dict[str, int]:
        return {category: nbytes for category, nbytes in self.peak_totals.items() if nbytes}

    # ------------------------------------------------------------------ internal
    def _add(self, tensor: torch.Tensor, category: str) -> None:
        try:
            storage = tensor.untyped_storage()
        except (NotImplementedError, RuntimeError, TypeError):
            return  # sparse, nested and other storage-less tensors
        key = id(storage)
        nbytes = self.round_bytes(storage.nbytes())
        entry = self.entries.get(key)
        if entry is not None:
            if entry.nbytes != nbytes:  # resized in place (out= ops, resize_)
                self.current += nbytes - entry.nbytes
                self.totals[entry.category] += nbytes - entry.nbytes
                entry.nbytes = nbytes
                if self.on_free is not None:
                    self.on_free(key)
                if self.on_alloc is not None:
                    self.on_alloc(key, storage.nbytes())
                self._update_peak()
            return
        self.seq += 1
        ref = weakref.ref(storage, self._freed_callback(key))
        self.entries[key] = _Entry(nbytes, category, self.seq, ref)
        self.current += nbytes
        self.totals[category] += nbytes
        if self.on_alloc is not None:
            self.on_alloc(key, storage.nbytes())
        self._update_peak()

    def _update_peak(self) -> None:
        if self.current > self.peak:
            self.peak = self.current
            self.peak_totals = dict(self.totals)
            self.peak_seq = self.seq
            self.peak_where = self.where

    def _freed_callback(self, key: int) -> Callable[[Any], None]:
        tracker_ref = weakref.ref(self)

        def freed(dead_ref: Any) -> None:
            tracker = tracker_ref()
            if tracker is None:
                return
            entry = tracker.entries.get(key)
            if entry is None or entry.ref is not dead_ref:
                return
            del tracker.entries[key]
            tracker.current -= entry.nbytes
            tracker.totals[entry.category] -= entry.nbytes
            if tracker.on_free is not None:
                tracker.on_free(key)

        return freed


def _storage_key(tensor: torch.Tensor) -> int | None:
    try:
        return id(tensor.untyped_storage())
    except (NotImplementedError, RuntimeError, TypeError):
        return None


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple, set)) or hasattr(value, "__next__"):
        for item in value:
            yield from _tensors(item)
