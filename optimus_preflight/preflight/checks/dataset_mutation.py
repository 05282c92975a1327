"""A ``__getitem__`` that rewrites the dataset's own data (``data.dataset_mutation``).

``x = self.x[i]; x.sub_(mean).div_(std)`` standardises a *view* of the stored table: each
read rewrites the row, so every epoch standardises the already standardised rows again,
and after a few epochs the inputs collapse (or explode). Nothing raises; the first epoch
even looks healthy.

The check hashes the tensors and arrays the dataset holds as attributes, reads a few
samples through ``dataset[i]``, and hashes them again.
"""

from __future__ import annotations

import hashlib
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
