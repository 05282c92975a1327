"""Set v's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_v")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def to_dev(batch, device):
    """A batch (tensor, tuple/list or dict of tensors) moved to ``device``; other leaves are kept."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_dev(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_dev(v, device) for v in batch)
    return batch


def rmse_of(fwd, loader_key="val_loader"):
    """Validation RMSE with fwd(model, batch) -> (predictions, targets) of any matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, to_dev(b, model_device(m)))
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw[loader_key], fn))
    return metric


def mean_of(fwd, loader_key="val_loader"):
    """Validation mean of fwd(model, batch) -> (sum, count)."""
    def metric(model, kw):
        return mean_over(model, kw[loader_key], lambda m, b: fwd(m, to_dev(b, model_device(m))))
    return metric


def acc_of(fwd, loader_key="val_loader"):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels); -100 labels are skipped."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, to_dev(b, model_device(m)))
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, kw[loader_key], fn)
    return metric


def split(x, y, n_train):
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])
