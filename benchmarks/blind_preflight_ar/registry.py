"""Set ar's case registry: set a's Case / CaseTable and data helpers, its own case table, synthetic signal generators,
and the one-line fixes ``verify.py`` trains next to each broken case (``FIXES``: no preflight involved)."""

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
    twin,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_ar")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix

TAU = 2 * math.pi


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rmse_on(loader_of, fwd):
    """Validation RMSE on loader_of(kw) with fwd(model, batch) -> (predictions, targets) of any matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, loader_of(kw), fn))
    return metric


def acc_on(loader_of, fwd=None):
    """Validation accuracy on loader_of(kw) with fwd(model, batch) -> (predicted labels, true labels)."""
    def metric(model, kw):
        return accuracy(model, loader_of(kw), fwd)
    return metric


def own_val(kw):
    return kw["val_loader"]


def truth_val(builder):
    """The fixed builder's validation loader: the correctly built windows / labels, for bugs in the data pipeline."""
    return lambda kw: builder(fixed=True)["val_loader"]


# ---------------------------------------------------------------- synthetic signals

def sine_series(n_series: int, length: int, s: int = 0, noise: float = 0.05) -> torch.Tensor:
    """(n_series, length) sums of two sinusoids with random periods, phases and amplitudes, plus noise."""
    g = gen(s)
    t = torch.arange(length).float()
    p1 = 10 + 10 * torch.rand(n_series, 1, generator=g)
    p2 = 4 + 3 * torch.rand(n_series, 1, generator=g)
    a1 = 0.7 + 0.6 * torch.rand(n_series, 1, generator=g)
    a2 = 0.3 + 0.4 * torch.rand(n_series, 1, generator=g)
    ph = torch.rand(n_series, 2, generator=g) * TAU
    x = a1 * torch.sin(TAU * t / p1 + ph[:, :1]) + a2 * torch.sin(TAU * t / p2 + ph[:, 1:])
    return x + noise * torch.randn(n_series, length, generator=g)


def windows(series: torch.Tensor, w: int, h: int, stride: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding windows over (S, L) series: inputs (N, w) and the next h values (N, h)."""
    u = series.unfold(1, w + h, stride).reshape(-1, w + h)
    return u[:, :w].contiguous(), u[:, w:].contiguous()


def har_windows(n: int, T: int = 48, C: int = 3, n_classes: int = 4, s: int = 0, noise: float = 0.5):
    """Activity windows (n, T, C): each class oscillates at its own frequency on every axis, random phases."""
    g = gen(s)
    y = torch.randint(0, n_classes, (n,), generator=g)
    t = torch.arange(T).float()
    f = (0.04 + 0.035 * y.float())[:, None, None]
    ph = torch.rand(n, C, 1, generator=g) * TAU
    a = 1 + 0.2 * torch.randn(n, C, 1, generator=g)
    x = a * torch.sin(TAU * f * t + ph) + noise * torch.randn(n, C, T, generator=g)
    return x.transpose(1, 2).contiguous(), y


def log_mel(n: int, F: int = 16, T: int = 32, n_classes: int = 5, s: int = 0):
    """Log-mel-like patches (n, F, T): class k puts energy in a band centred on bin 2 + 3k, noisy background."""
    g = gen(s)
    y = torch.randint(0, n_classes, (n,), generator=g)
    bins = torch.arange(F).float()[None, :, None]
    centre = (2 + 3 * y.float() + 0.7 * torch.randn(n, generator=g))[:, None, None]
    env = 0.6 + 0.4 * torch.rand(n, 1, T, generator=g)
    x = 2.0 * env * torch.exp(-((bins - centre) ** 2) / 3.0) + 0.6 * torch.randn(n, F, T, generator=g)
    return x, y
