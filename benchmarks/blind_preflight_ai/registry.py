"""Set ai's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_ai")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rmse_of(fwd, batches=None):
    """Validation RMSE with fwd(model, batch) -> (predictions, targets) of any matching numel; ``batches``: a fixed
    list of batches to score on (default: the case's own val_loader)."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, batches if batches is not None else kw["val_loader"], fn))
    return metric


def acc_of(fwd, batches=None):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels)."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, batches if batches is not None else kw["val_loader"], fn)
    return metric


@torch.no_grad()
def class_mean_acc(model, batches, fwd, n_classes):
    """Mean over classes of the per-class recall (pixels or samples), fwd(model, batch) -> (pred, target)."""
    was = model.training
    model.eval()
    right = torch.zeros(n_classes)
    total = torch.zeros(n_classes)
    for b in batches:
        p, y = fwd(model, b)
        p, y = p.reshape(-1).cpu(), y.reshape(-1).cpu()
        keep = (y >= 0) & (y < n_classes)
        p, y = p[keep], y[keep]
        total += torch.bincount(y, minlength=n_classes).float()
        right += torch.bincount(y[p == y], minlength=n_classes).float()
    model.train(was)
    seen = total > 0
    return float((right[seen] / total[seen]).mean())


def split(x, y, n_train):
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])
