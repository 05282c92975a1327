"""Set z's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_z")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def to_dev(model, *tensors):
    dev = model_device(model)
    return [t.to(dev) for t in tensors]


def rmse_of(fwd):
    """Validation RMSE with fwd(model, batch) -> (predictions, targets) of any matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


def acc_of(fwd):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels)."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.cpu(), y.cpu()
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def plain_acc(model, kw):
    """model(x).argmax(-1) against the last element of each validation batch."""
    return acc_of(lambda m, b: (m(to_dev(m, b[0])[0]).float().argmax(-1), b[-1]))(model, kw)


def split(x, y, n_train):
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def tensor_loaders(x, y, n_train, batch_size=32, **kw):
    from torch.utils.data import TensorDataset
    (xt, yt), (xv, yv) = split(x, y, n_train)
    return (loader(TensorDataset(xt, yt), batch_size, **kw),
            loader(TensorDataset(xv, yv), 256, shuffle=False))


def standardize(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean(0)) / x.std(0)
