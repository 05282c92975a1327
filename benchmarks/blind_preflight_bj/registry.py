"""Set bj's case registry (time-series forecasting and anomaly detection): set a's Case / CaseTable, the family
modules, shared series/window helpers, metrics, and the one-line fixes ``verify.py`` trains next to each broken case."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight.fixes import FixTable
from benchmarks.blind_preflight.registry import CaseTable, gen, loader, mean_over, seed, twin  # noqa: F401

TABLE = CaseTable.by_family("benchmarks.blind_preflight_bj")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def series(S: int = 8, T: int = 480, s: int = 0, period: int = 12, noise: float = 0.1,
           level: float = 0.0, spread: float = 0.0) -> torch.Tensor:
    """S seasonal series of length T (two harmonics, per-series phase/amplitude), standardised scale unless
    ``level``/``spread`` put each series at its own raw level (level + spread * U(0, 1))."""
    g = gen(s)
    t = torch.arange(T).float()
    amp = 0.6 + 0.8 * torch.rand(S, 1, generator=g)
    ph = torch.rand(S, 1, generator=g) * 6.283
    base = level + spread * torch.rand(S, 1, generator=g)
    x = amp * torch.sin(2 * math.pi * t / period + ph) + 0.5 * amp * torch.sin(4 * math.pi * t / period + 2 * ph)
    scale = 1.0 + (spread / 10.0) * torch.rand(S, 1, generator=g)
    return base + scale * x + noise * torch.randn(S, T, generator=g)


def windows(x: torch.Tensor, L: int, H: int, stride: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, T) -> inputs (N, L), horizon targets (N, H)."""
    w = x.unfold(1, L + H, stride).reshape(-1, L + H)
    return w[:, :L].contiguous(), w[:, L:].contiguous()


def time_split(x: torch.Tensor, frac: float = 0.75) -> tuple[torch.Tensor, torch.Tensor]:
    cut = int(x.shape[-1] * frac)
    return x[..., :cut], x[..., cut:]


def loaders(train: tuple, val: tuple, bs: int = 32, collate_fn=None):
    tl = loader(TensorDataset(*train), bs, shuffle=True, collate_fn=collate_fn)
    vl = loader(TensorDataset(*val), 128, shuffle=False, collate_fn=collate_fn)
    return tl, vl


def mlp(i: int, o: int, h: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, o))


def mae_of(fwd):
    """Validation MAE on the horizon with fwd(model, batch) -> (predictions, targets) of matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            return (p.reshape(-1).float() - y.reshape(-1).float()).abs().sum().item(), y.numel()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def default_fwd(m, b):
    return m(b[0]), b[-1]


val_mae = mae_of(default_fwd)


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Rank AUROC (labels 1 = anomaly)."""
    order = scores.argsort()
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=scores.dtype)
    pos = labels.bool()
    n1, n0 = pos.sum().item(), (~pos).sum().item()
    return float((ranks[pos].sum().item() - n1 * (n1 + 1) / 2) / (n1 * n0))


def recon_auroc(model, kw) -> float:
    """Anomaly AUROC of the per-window reconstruction error; labels live on the val loader (``anomaly_labels``)."""
    vl = kw["val_loader"]
    was = model.training
    model.eval()
    with torch.no_grad():
        scores = torch.cat([((model(b[0]) - b[0]) ** 2).mean(1) for b in vl])
    model.train(was)
    return auroc(scores, vl.anomaly_labels)


def pinball(pred: torch.Tensor, y: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """Quantile loss: pred (..., Q), y (...)."""
    e = y.unsqueeze(-1) - pred
    return torch.maximum(qs * e, (qs - 1) * e).mean()
