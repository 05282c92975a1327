"""Set bi's case registry: probabilistic and multi-task prediction on tabular and sensor data. Set a's Case /
CaseTable, the set's own data helpers and metrics, and the one-line fixes ``verify.py`` trains next to each broken
case (``FIXES``: no preflight involved)."""

from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F

from benchmarks.blind_preflight.fixes import FixTable
from benchmarks.blind_preflight.registry import CaseTable, gen, loader, mean_over, seed, twin  # noqa: F401

TABLE = CaseTable.by_family("benchmarks.blind_preflight_bi")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix

TAUS = (0.1, 0.5, 0.9)


def fixed_of(builder):
    return lambda: builder(fixed=True)


def hetero(n: int = 1600, d: int = 8, s: int = 0):
    """Tabular rows with a heteroscedastic target: mean 2 tanh(x.w), noise std 0.05 .. 0.85 driven by x.v."""
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g) / d ** 0.5
    v = torch.randn(d, generator=g) / d ** 0.5
    sigma = 0.05 + 0.8 * torch.sigmoid(3 * (x @ v))
    y = 2 * torch.tanh(x @ w) + sigma * torch.randn(n, generator=g)
    return x, y


def ordinal(n: int = 1600, d: int = 8, k: int = 5, s: int = 1):
    """Ordinal labels 0..k-1 from a noisy latent score cut at fixed thresholds."""
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g) / d ** 0.5
    z = 2 * (x @ w) + 0.3 * torch.randn(n, generator=g)
    edges = torch.linspace(-1.5, 1.5, k - 1)
    return x, torch.bucketize(z, edges)


def imbalanced(n: int = 2000, d: int = 8, s: int = 2):
    """Binary labels with about 6% positives from a noisy logistic teacher."""
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g) / d ** 0.5
    p = torch.sigmoid(3 * (x @ w) - 5.0)
    return x, (torch.rand(n, generator=g) < p).float()


def mlp(d_in: int, d_out: int, h: int = 64) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, d_out))


def tds(*tensors):
    return torch.utils.data.TensorDataset(*tensors)


def adam(model, lr: float = 3e-3):
    return torch.optim.Adam(model.parameters(), lr=lr)


# ---- metrics (validation, no preflight) ----

def gaussian_nll_metric(predict):
    """Held-out Gaussian NLL with predict(model, x) -> (mean, std)."""
    def metric(model, kw):
        def fn(m, b):
            mu, std = predict(m, b[0])
            y = b[1].reshape(-1)
            mu, std = mu.reshape(-1), std.reshape(-1).clamp_min(1e-6)
            nll = 0.5 * math.log(2 * math.pi) + std.log() + 0.5 * ((y - mu) / std) ** 2
            return nll.sum().item(), y.numel()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def pinball_metric(predict):
    """Held-out mean pinball loss at the model's quantile levels with predict(model, x) -> (B, Q)."""
    def metric(model, kw):
        taus = torch.tensor(model.taus)

        def fn(m, b):
            q = predict(m, b[0])
            err = b[1].reshape(-1, 1) - q
            return torch.maximum(taus * err, (taus - 1) * err).sum().item(), err.numel()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def rank_mae_metric(predict):
    """Held-out mean absolute rank error with predict(model, x) -> predicted ranks."""
    def metric(model, kw):
        return mean_over(model, kw["val_loader"],
                         lambda m, b: ((predict(m, b[0]).float() - b[1].float()).abs().sum().item(), b[1].numel()))
    return metric


@torch.no_grad()
def balanced_accuracy(model, kw, predict=None):
    """Mean of per-class recalls on the validation loader; predict(model, x) -> labels (default: logit > 0)."""
    was = model.training
    model.eval()
    ps, ys = [], []
    for b in kw["val_loader"]:
        ps.append(predict(model, b[0]) if predict else (model(b[0]).reshape(-1) > 0).long())
        ys.append(b[1].reshape(-1).long())
    model.train(was)
    p, y = torch.cat(ps), torch.cat(ys)
    return sum(((p == c) & (y == c)).sum().item() / max((y == c).sum().item(), 1) for c in y.unique().tolist()) / len(
        y.unique())


def rmse_metric(predict):
    def metric(model, kw):
        def fn(m, b):
            p, y = predict(m, b)
            return ((p.reshape(-1) - y.reshape(-1)) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


def coral_ranks(logits: torch.Tensor) -> torch.Tensor:
    return (torch.sigmoid(logits) > 0.5).sum(1)


def coral_levels(y: torch.Tensor, k: int) -> torch.Tensor:
    return (y[:, None] > torch.arange(k - 1)[None, :]).float()


def pinball(q: torch.Tensor, y: torch.Tensor, taus) -> torch.Tensor:
    taus = torch.as_tensor(taus, dtype=q.dtype)
    err = y.reshape(-1, 1) - q
    return torch.maximum(taus * err, (taus - 1) * err).mean()


__all__ = ["F", "nn", "torch"]
