"""Set ae's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_ae")
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


def acc_of(fwd):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels); -100 labels are skipped."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def split(x, y, n_train):
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def smooth_signals(n: int, length: int, rank: int = 4, s: int = 0) -> torch.Tensor:
    """Learnable 1-D signals: random mixtures of ``rank`` fixed smooth waveforms (a low-rank manifold), std ~1."""
    g = gen(s)
    t = torch.linspace(0, 1, length)
    freqs = torch.arange(1, rank + 1, dtype=torch.float32)
    phase = torch.rand(rank, generator=g) * 6.28
    basis = torch.sin(2 * math.pi * freqs[:, None] * t[None, :] + phase[:, None])  # (rank, length)
    coef = torch.randn(n, rank, generator=g)
    return coef @ basis / math.sqrt(rank / 2)


def retrieval_top1(za: torch.Tensor, zb: torch.Tensor) -> float:
    """Share of rows whose nearest row of zb (cosine) is its own partner."""
    za = torch.nn.functional.normalize(za.float(), dim=1)
    zb = torch.nn.functional.normalize(zb.float(), dim=1)
    return (za @ zb.T).argmax(1).eq(torch.arange(len(za), device=za.device)).float().mean().item()
