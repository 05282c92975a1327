"""Set x's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_x")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rmse_of(fwd):
    """Validation RMSE with fwd(model, batch) -> (predictions, targets) of any matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


def mae_of(fwd):
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return (p - y).abs().sum().item(), y.numel()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def acc_of(fwd, batches=None):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels); -100 labels are skipped.
    ``batches``: a function of kw giving the batches to score (default: kw["val_loader"])."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            y = y.to(p.device)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, batches(kw) if batches else kw["val_loader"], fn)
    return metric


@torch.no_grad()
def balanced_acc_of(fwd, n_classes):
    """Mean per-class recall on the validation loader (imbalanced cases)."""
    def metric(model, kw):
        was = model.training
        model.eval()
        right = torch.zeros(n_classes)
        count = torch.zeros(n_classes)
        for b in kw["val_loader"]:
            p, y = fwd(model, b)
            p, y = p.cpu(), y.cpu()
            for c in range(n_classes):
                m = y == c
                count[c] += m.sum()
                right[c] += (p[m] == c).sum()
        model.train(was)
        return float((right / count.clamp(min=1)).mean())
    return metric


def split(x, y, n_train):
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])
