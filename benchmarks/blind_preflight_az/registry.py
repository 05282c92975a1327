"""Set az's case registry: set a's Case / CaseTable and data helpers, its own case table, the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved), and the synthetic time-series
helpers the cases share (seasonal panels, sliding windows, accelerometer streams)."""

from __future__ import annotations

import contextlib
import math

import torch
from torch.utils.data import TensorDataset

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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_az")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def _autocast(kw):
    if kw.get("precision", "fp32") == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def rmse_of(fwd, batches=None):
    """Validation RMSE with fwd(model, batch) -> (predictions, targets); ``batches(kw)`` overrides kw["val_loader"].
    A bf16 case is scored under bf16 autocast, as it runs."""
    def metric(model, kw):
        def fn(m, b):
            with _autocast(kw):
                p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, batches(kw) if batches else kw["val_loader"], fn))
    return metric


def acc_of(fwd):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels)."""
    def metric(model, kw):
        def fn(m, b):
            with _autocast(kw):
                p, y = fwd(m, b)
            return (p == y).sum().item(), y.numel()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def tds(*tensors):
    return TensorDataset(*tensors)


def seasonal_panel(n_series: int, length: int, s: int, period: int = 24, noise: float = 0.2):
    """(S, L) series: level + amplitude * daily shape (two harmonics, own phase) + AR(1) noise."""
    g = gen(s)
    t = torch.arange(length, dtype=torch.float32)
    level = torch.randn(n_series, 1, generator=g) * 3
    amp = 0.5 + 2 * torch.rand(n_series, 1, generator=g)
    ph = 2 * math.pi * torch.rand(n_series, 1, generator=g)
    w = 2 * math.pi / period
    shape = torch.sin(w * t + ph) + 0.5 * torch.sin(2 * w * t + 2 * ph)
    e = torch.randn(n_series, length, generator=g) * noise
    for i in range(1, length):
        e[:, i] += 0.5 * e[:, i - 1]
    return level + amp * shape + e


def windows(series: torch.Tensor, w: int, h: int = 1, offset: int = 0):
    """Sliding windows of one 1-D series: inputs series[i:i+w], targets series[i+w+offset : i+w+offset+h]."""
    n = series.numel() - w - offset - h + 1
    idx = torch.arange(n)[:, None]
    x = series[idx + torch.arange(w)]
    y = series[idx + w + offset + torch.arange(h)]
    return x, y


def accel_stream(length: int, n_classes: int, s: int, seg=(40, 100)):
    """A 3-axis accelerometer stream (L, 3) with per-sample activity labels (L,): each activity has its own gravity
    direction and its own oscillation frequency on one axis; segments of random length."""
    gc = gen(12345)                                # the activities' physics: the same in every recording
    grav = torch.randn(n_classes, 3, generator=gc)
    grav = grav / grav.norm(dim=1, keepdim=True)
    freq = torch.linspace(0.05, 0.3, n_classes)
    axis = torch.arange(n_classes) % 3
    g = gen(s)
    labels = torch.empty(length, dtype=torch.long)
    i = 0
    while i < length:
        n = int(torch.randint(seg[0], seg[1] + 1, (1,), generator=g))
        labels[i:i + n] = int(torch.randint(0, n_classes, (1,), generator=g))
        i += n
    t = torch.arange(length, dtype=torch.float32)
    x = 0.6 * grav[labels] + 0.6 * torch.randn(length, 3, generator=g)
    osc = torch.sin(freq[labels] * 2 * math.pi * t)
    x[torch.arange(length), axis[labels]] += osc
    return x, labels
