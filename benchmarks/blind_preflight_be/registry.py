"""Set be's case registry (model compression and continual learning): set a's Case / CaseTable and data helpers, its
own case table, and the one-line fixes ``verify.py`` trains next to each broken case (``FIXES``: no preflight)."""

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
    twin,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_be")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rmse_of(fwd):
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


def acc_of(fwd):
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            return (p == y).float().sum().item(), y.numel()
        return mean_over(model, kw["val_loader"], fn)
    return metric


plain_acc = acc_of(lambda m, b: (m(b[0]).argmax(-1), b[-1]))
