"""A ``__getitem__`` that rewrites the dataset's own data (``data.dataset_mutation``).

``x = self.x[i]; x.sub_(mean).div_(std)`` standardises a *view* of the stored table: each
read rewrites the row, so every epoch standardises the already standardised rows again,
and after a few epochs the inputs collapse (or explode). Nothing raises; the first epoch
even looks healthy.

The check hashes the tensors and arrays the dataset holds as attributes, reads a few
samples through ``dataset[i]``, and hashes them again. A changed attribute is not yet the
harm: a scratch buffer that each read fills afresh (``self._buf.copy_(self.x[i])``,
normalised in place, returned as a clone) changes on every read and is harmless, as is a
cache filled on first use. The harm is that the same index returns other values on a
later read. So when an attribute changed, the same samples are read again, in the
opposite order, each read from the same random state (the global generators and the
dataset's own): samples identical to the first reads are stable (quiet), and different
ones are the stored table drifting (DATASET_MUTATED). A sample that is a view of a changed
attribute (the buffer itself, which the next read overwrites) is not called stable.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from optimus_preflight.preflight.checks.batch_checks import is_map_style
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.split_overlap import subset_root
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training import rng
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MAX_HASHED_BYTES = 256 << 20  # per attribute: larger stores are not hashed (time)
SAMPLES = 4


def _bytes_of(value: Any) -> bytes | None:
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and not value.is_sparse:
        if value.numel() * value.element_size() > MAX_HASHED_BYTES:
            return None
        return value.detach().contiguous().view(torch.uint8).numpy().tobytes() if value.numel() else b""
    if isinstance(value, np.ndarray) and value.dtype != object:
        return value.tobytes() if value.nbytes <= MAX_HASHED_BYTES else None
    return None


def stored_digests(dataset: Any) -> dict[str, str]:
    """Digest per tensor/array attribute of ``dataset``."""
    found = {}
    for name, value in vars(dataset).items():
        raw = _bytes_of(value)
        if raw is not None:
            found[name] = hashlib.blake2b(raw, digest_size=16).hexdigest()
    return found


def _generators(dataset: Any) -> list[tuple[Any, Any]]:
    """The dataset's own random generators, with their states now."""
    found = []
    for value in vars(dataset).values():
        if isinstance(value, torch.Generator):
            found.append((value, value.get_state()))
        elif isinstance(value, np.random.Generator):
            found.append((value, value.bit_generator.state))
        elif isinstance(value, (np.random.RandomState, random.Random)):
            found.append((value, value.get_state() if isinstance(value, np.random.RandomState) else value.getstate()))
    return found


def _set_generators(saved: list[tuple[Any, Any]]) -> None:
    for generator, state in saved:
        if isinstance(generator, torch.Generator):
            generator.set_state(state)
        elif isinstance(generator, np.random.Generator):
            generator.bit_generator.state = state
        elif isinstance(generator, np.random.RandomState):
            generator.set_state(state)
        else:
            generator.setstate(state)


def _values(sample: Any) -> Any:
    """``sample`` with every tensor and array copied: what this read returned, whatever
    later reads write into the buffers it may share."""
    if isinstance(sample, torch.Tensor):
        return sample.detach().clone()
    if isinstance(sample, np.ndarray):
        return sample.copy()
    if isinstance(sample, Mapping):
        return {key: _values(value) for key, value in sample.items()}
    if isinstance(sample, (list, tuple)):
        return [_values(value) for value in sample]
    return sample


def same_sample(a: Any, b: Any) -> bool | None:
    """Whether two reads returned the same values (NaN equal to NaN); None when a part
    cannot be compared."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        if a.is_sparse or b.is_sparse:
            a, b = a.to_dense(), b.to_dense()
        same = a == b
        if a.is_floating_point() or a.is_complex():
            same |= a.isnan() & b.isnan()
        return bool(same.all())
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if a.keys() != b.keys():
            return False
        return _all_same(same_sample(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return False
        return _all_same(same_sample(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a type whose == raises or is not a truth value
        return None


def _all_same(results: Any) -> bool | None:
    unknown = False
    for result in results:
        if result is False:
            return False
        unknown = unknown or result is None
    return None if unknown else True


def _shares_memory(sample: Any, stored: list[Any]) -> bool:
    """Whether a tensor or array of ``sample`` is (a view of) one of ``stored``."""
    parts = leaves(sample)
    for part in parts:
        for value in stored:
            if isinstance(part, torch.Tensor) and isinstance(value, torch.Tensor):
                if (part.device == value.device and part.device.type != "meta" and part.numel() and value.numel()
                        and part.untyped_storage().data_ptr() == value.untyped_storage().data_ptr()):
                    return True
            elif isinstance(part, np.ndarray) and isinstance(value, np.ndarray) and np.shares_memory(part, value):
                return True
    return False


def reads_are_stable(read: Callable[[int], Any], indices: list[int], dataset: Any, changed: list[str]) -> bool | None:
    """Read ``indices`` in order, then in the opposite order, each read from the same
    random state: True when every index returned the same values both times (what changed
    is overwritten by each read), False when one did not (or returned a view of a changed
    attribute), None when a sample cannot be compared."""
    stored = [vars(dataset)[name] for name in changed if name in vars(dataset)]
    global_state = rng.capture()
    generators = _generators(dataset)

    def fresh_read(index: int) -> Any:
        rng.restore(global_state)
        _set_generators(generators)
        return read(index)

    first = {}
    for index in indices:
        sample = fresh_read(index)
        if _shares_memory(sample, stored):
            return False
        first[index] = _values(sample)
    return _all_same(same_sample(first[index], _values(fresh_read(index))) for index in reversed(indices))


class DatasetMutationCheck(Check):
    """DATASET_MUTATED: reading samples changes the data the dataset stores."""

    name = "data.dataset_mutation"
    stage = Stage.DATA
    codes = ("DATASET_MUTATED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.train_loader
        if not isinstance(loader, DataLoader) or not is_map_style(loader.dataset):
            findings.data["summary"] = "not a map-style DataLoader"
            return
        root, indices = subset_root(loader.dataset)
        try:
            before = stored_digests(root)
        except TypeError:  # no __dict__ (a C extension dataset)
            before = {}
        if not before:
            findings.data["summary"] = "the dataset holds no tensor or array attribute"
            return
        guard = DataGuard(ctx, self.name, findings)
        size = guard.call(len, root, what="len(dataset)")
        picked = (indices or list(range(size)))[:SAMPLES]
        with preserved_data_state(ctx):
            for index in picked:
                guard.call(root.__getitem__, index, what=f"dataset[{index}]")
        changed = sorted(name for name, digest in stored_digests(root).items() if before.get(name) != digest)
        findings.data["summary"] = f"{len(before)} stored array(s) hashed; {len(changed)} changed by reading"
        if not changed:
            return
        with preserved_data_state(ctx):
            stable = reads_are_stable(
                lambda index: guard.call(root.__getitem__, index, what=f"dataset[{index}]"), picked, root, changed)
        findings.data["stable_reads"] = stable
        if stable:  # a scratch buffer or a cache: every read of an index returns the same sample
            findings.data["summary"] += " (overwritten by each read: the same index reads the same sample)"
            return
        findings.error(
            "DATASET_MUTATED",
            f"reading {len(picked)} sample(s) with dataset[i] changed what {type(root).__name__} stores "
            f"(self.{', self.'.join(changed)}): __getitem__ modifies its data in place, e.g. x = self.x[i]; "
            "x.sub_(mean).div_(std) on a view of the table. Every epoch transforms the already transformed rows "
            "again, so the inputs drift further each epoch while the first one looks healthy",
            "Transform a copy: x = (self.x[i] - mean) / std (out-of-place ops), or self.x[i].clone() before any "
            "in-place op; or normalise the whole table once in __init__.",
            "data.train",
        )
