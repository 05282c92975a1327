"""Set q's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved)."""

from __future__ import annotations

import math

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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_q")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix

# per broken case: the one-line fix and the public thread / page / issue the root cause was found in
FIX_LINE: dict[str, str] = {}
SOURCE: dict[str, str] = {}


def broken(name: str, family: str, bug: str, fix_line: str, source: str, cause_pattern: str):
    """Register a broken case with its family, bug sentence, one-line fix, source URL and cause pattern."""
    FIX_LINE[name] = fix_line
    SOURCE[name] = source
    return case(name, family, bug, cause_pattern)


def rng(s: int):
    import numpy as np
    return np.random.default_rng(s)


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rmse_of(fwd, batches=None):
    """RMSE with fwd(model, batch) -> (predictions, targets) of any matching numel, over ``batches`` (a callable
    returning an iterable of batches) or the case's val_loader."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, batches() if batches else kw["val_loader"], fn))
    return metric


def acc_of(fwd, batches=None):
    """Accuracy with fwd(model, batch) -> (predicted labels, true labels), over ``batches`` or the val_loader."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, batches() if batches else kw["val_loader"], fn)
    return metric


def split(x, y, n_train):
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])
