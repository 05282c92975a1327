"""Set u's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved)."""

from __future__ import annotations

import math

import numpy as np
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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_u")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rng(s: int) -> np.random.Generator:
    return np.random.default_rng(s)


def acc_of(fwd):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels); -100 / 255 ignored."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            keep = (y != -100) & (y != 255)
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def rmse_of(fwd):
    """Validation RMSE with fwd(model, batch) -> (predictions, targets) of any matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


@torch.no_grad()
def on_truth(model, images: torch.Tensor, fn, batch: int = 128) -> torch.Tensor:
    """Run ``fn(model, x)`` over ``images`` in eval mode (for metrics scored against a dataset's true targets when the
    user's own val pipeline carries the bug too)."""
    was = model.training
    model.eval()
    dev = model_device(model)
    outs = [fn(model, images[i:i + batch].to(dev)).cpu() for i in range(0, len(images), batch)]
    model.train(was)
    return torch.cat(outs)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Element-wise IoU of (N, 4) xyxy boxes."""
    lt = torch.maximum(a[:, :2], b[:, :2])
    rb = torch.minimum(a[:, 2:], b[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(1)
    area = lambda z: (z[:, 2:] - z[:, :2]).clamp(min=0).prod(1)  # noqa: E731
    return inter / (area(a) + area(b) - inter + 1e-9)
