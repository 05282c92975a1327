"""Set k's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved)."""

from __future__ import annotations

import math

import torch

from benchmarks.blind_preflight.fixes import FixTable, accuracy, val_acc  # noqa: F401
from benchmarks.blind_preflight.registry import (  # noqa: F401
    Case,
    CaseTable,
    loader,
    seed,
    teacher_classes,
    teacher_regression,
    token_sequences,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_k")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(s)


def twin(builder):
    """The corrected twin of a broken case's builder (``builder(fixed=True)``), as a plain function."""
    def build():
        return builder(fixed=True)
    build.__module__ = "benchmarks.blind_preflight_k.cases_healthy"
    build.__name__ = builder.__name__ + "_fixed"
    return build


def fixed_of(builder):
    return lambda: builder(fixed=True)


def model_device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def mean_over(model, batches, fn) -> float:
    """Average of fn(model, batch) -> (sum, count) over the batches, the model in eval mode."""
    was = model.training
    model.eval()
    total = n = 0.0
    for batch in batches:
        s, c = fn(model, batch)
        total += float(s)
        n += float(c)
    model.train(was)
    return total / max(n, 1.0)


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
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def split(x, y, n_train):
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])
