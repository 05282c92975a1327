"""Live-storage accounting for FSDP2 (``fully_shard``) steps, on fake or real tensors.

``StorageTracker`` counts the storages that ops return. Under FSDP2 two things escape it:

- parameters, gradients and optimizer state are ``DTensor``\\ s, wrappers without a
  storage of their own: their local tensors hold the bytes, so wrappers are unwrapped
  (``__tensor_flatten__``) wherever they appear;
- the all-gathered (unsharded) parameters keep one storage for the whole run and FSDP2
  frees and re-allocates it with ``UntypedStorage.resize_`` (not an op, so no dispatch
  sees it): while tracking, ``resize_`` is wrapped to follow those sizes.

The FSDP2 collectives are wrapped too, so what they allocate is labelled by what it is:
``all_gather`` (the flat all-gather input and output buffers), ``unsharded_params``
(the gathered parameters), ``reduce_scatter`` (the reduce-scatter input and output; the
output becomes the sharded gradients, relabelled ``grads`` after backward).
The same tracker runs in the estimate (fake tensors, fake process group) and in the
measurement it is checked against (real tensors, gloo), as ``StorageTracker`` does.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from optimus_preflight.memory.tracker import REPORT_KEYS, StorageTracker, _Entry, _tensors

# Report keys (params, grads, ...) of the FSDP categories: the gathered parameters are parameters;
# the communication buffers are "other" (split out in ``detail``).
FSDP_REPORT_KEY = {"unsharded_params": "params", "all_gather": "other", "reduce_scatter": "other"}

_DEVICE = torch.ops.prim.device.default

# (attribute of torch's _fsdp_param_group module, the category of what it allocates)
_LABELLED = (
    ("foreach_all_gather", "all_gather"),
    ("foreach_all_gather_copy_out", "unsharded_params"),
    ("foreach_reduce", "reduce_scatter"),
)


def local_tensors(value: Any) -> Iterable[torch.Tensor]:
    """The plain tensors inside ``value`` (DTensors and other wrappers unwrapped)."""
    for tensor in _tensors(value):
        yield from _unwrap(tensor)


def _unwrap(tensor: torch.Tensor) -> Iterable[torch.Tensor]:
    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        for name in names:
            inner = getattr(tensor, name)
            if isinstance(inner, torch.Tensor):  # DTensor also names its device mesh
                yield from _unwrap(inner)
    else:
        yield tensor


class FSDPStorageTracker(StorageTracker):
    """A ``StorageTracker`` that sees through DTensors and follows FSDP2's storage resizes."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._saved: list[tuple[Any, str, Any]] = []
        self._thread = threading.get_ident()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE:  # asked tens of thousands of times per step (autograd, FSDP): allocates nothing
            return args[0].device
        out = func(*args, **(kwargs or {}))
        for tensor in _outputs(out):
            for local in _unwrap(tensor):
                self._add(local, self.phase)
        return out

    def track(self, tensors: Any, category: str) -> None:
        super().track(list(local_tensors(tensors)), category)

    def relabel(self, tensors: Any, category: str) -> None:
        super().relabel(list(local_tensors(tensors)), category)

    def peak_breakdown(self) -> dict[str, int]:
        report = dict.fromkeys(REPORT_KEYS, 0)
        for category, nbytes in super().peak_breakdown().items():
            report[category] += nbytes
        for category, key in FSDP_REPORT_KEY.items():  # moved out of "other"
            nbytes = self.peak_totals.get(category, 0)
            report["other"] -= nbytes
            report[key] += nbytes
        return report

    # ----------------------------------------------------------- patching
    def __enter__(self):
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group

        self._thread = threading.get_ident()
        self._patch(torch.UntypedStorage, "resize_", self._resize_wrapper(torch.UntypedStorage.resize_))
        for name, category in _LABELLED:
            self._patch(_fsdp_param_group, name, self._labelled(getattr(_fsdp_param_group, name), category))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            while self._saved:
                owner, name, original = self._saved.pop()
                setattr(owner, name, original)

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def _labelled(self, function: Callable, category: str) -> Callable:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            phase = self.phase
            self.phase = category
            try:
                return function(*args, **kwargs)
            finally:
                self.phase = phase

        return run

    def _resize_wrapper(self, original: Callable) -> Callable:
        tracker = self

        @functools.wraps(original)
        def resize_(storage: torch.UntypedStorage, size: int) -> Any:
            result = original(storage, size)
            if threading.get_ident() == tracker._thread:  # not another thread's storages
                tracker._resized(storage)
            return result

        return resize_

    def _resized(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        nbytes = self.round_bytes(storage.nbytes())
        entry = self.entries.get(key)
        if entry is None:
            if nbytes == 0:
                return
            self.seq += 1
            entry = _Entry(0, "unsharded_params", self.seq, weakref.ref(storage, self._freed_callback(key)))
            self.entries[key] = entry
        elif entry.nbytes == 0 and nbytes > 0:
            # Re-allocated after a reshard: a gathered parameter again.
            entry.category = "unsharded_params"
            self.seq += 1
            entry.seq = self.seq
        if self.on_free is not None and entry.nbytes > 0:
            self.on_free(key)
        if self.on_alloc is not None and nbytes > 0:
            self.on_alloc(key, storage.nbytes())
        delta = nbytes - entry.nbytes
        entry.nbytes = nbytes
        self.current += delta
        self.totals[entry.category] += delta
        self._update_peak()


def _outputs(out: Any) -> Iterable[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for item in out:
            yield from _outputs(item)
