"""Set ad's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_ad")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rmse_of(fwd, batches=None):
    """RMSE with fwd(model, batch) -> (predictions, targets) over kw["val_loader"] (or batches(kw))."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, batches(kw) if batches else kw["val_loader"], fn))
    return metric


def acc_of(fwd, batches=None):
    """Accuracy with fwd(model, batch) -> (predicted labels, true labels) over kw["val_loader"] (or batches(kw))."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, batches(kw) if batches else kw["val_loader"], fn)
    return metric


def balanced_acc_of(fwd, classes: int):
    """Mean per-class recall over kw["val_loader"]."""
    @torch.no_grad()
    def metric(model, kw):
        was = model.training
        model.eval()
        hit = torch.zeros(classes)
        cnt = torch.zeros(classes)
        for b in kw["val_loader"]:
            p, y = fwd(model, b)
            p, y = p.reshape(-1).cpu(), y.reshape(-1).cpu()
            for c in range(classes):
                m = y == c
                cnt[c] += m.sum()
                hit[c] += (p[m] == c).sum()
        model.train(was)
        return float((hit / cnt.clamp(min=1)).mean())
    return metric


def first_arg(m, b):
    return m(b[0]).argmax(-1), b[-1]
