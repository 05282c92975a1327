"""Set l's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_l")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rmse_of(fwd, key="val_loader"):
    """RMSE over kw[key] with fwd(model, batch) -> (predictions, targets) of any matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw[key], fn))
    return metric


def acc_of(fwd, key="val_loader"):
    """Accuracy over kw[key] with fwd(model, batch) -> (predicted labels, true labels); -100 is skipped."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, kw[key], fn)
    return metric


def on_batches(metric, batches):
    """A metric over a fixed list of batches (built by the case itself, e.g. correctly labelled ones)."""
    return lambda model, kw: metric(model, {"val_loader": batches})


def split(x, y, n_train):
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """ROC AUC (Mann-Whitney) of scores for the positive (True) entries."""
    order = scores.argsort()
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=scores.dtype)
    n_pos = positive.sum().item()
    n_neg = len(scores) - n_pos
    return ((ranks[positive].sum().item() - n_pos * (n_pos + 1) / 2) / max(n_pos * n_neg, 1))
