"""Set t's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved)."""

from __future__ import annotations

import math

import torch

from benchmarks.blind_preflight.fixes import FixTable, accuracy, val_acc  # noqa: F401
from benchmarks.blind_preflight.registry import (  # noqa: F401
    Case,
    CaseTable,
    gen,
    loader,
    mean_over,
    model_device,
    seed,
    teacher_classes,
    teacher_regression,
    token_sequences,
    twin,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_t")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rmse_on(batches, fwd):
    """Validation RMSE over ``batches`` with fwd(model, batch) -> (predictions, targets) of matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, batches(kw), fn))
    return metric


def acc_on(batches, fwd):
    """Accuracy over ``batches`` with fwd(model, batch) -> (predicted labels, true labels); -100 is skipped."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, batches(kw), fn)
    return metric


def val_batches(kw):
    return kw["val_loader"]


def dev(model):
    return next(model.parameters()).device


def to_dev(model, *tensors):
    d = dev(model)
    return [t.to(d) for t in tensors]


def blobs(n: int, size: int, g: torch.Generator, radius: float = 2.0):
    """Centres (n, 2) in pixels (x, y) and a (n, size, size) Gaussian blob image at each centre."""
    c = torch.rand(n, 2, generator=g) * (size - 4) + 2
    ys, xs = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    img = torch.exp(-((xs - c[:, 0, None, None]) ** 2 + (ys - c[:, 1, None, None]) ** 2) / (2 * radius ** 2))
    return c, img
