"""How much a tensor behaves like a series along one axis, and how columns go with a target (pure)."""

from __future__ import annotations

import torch


def lag_one(values: torch.Tensor, dim: int) -> float:
    """The lag-1 autocorrelation of ``values`` along ``dim``, each series centred on its own
    mean and the products pooled over all of them: near 1 for a smooth signal (time, a
    spectrum), near 0 for unordered features or shuffled rows."""
    x = values.detach().double().movedim(dim, -1)
    x = x - x.mean(dim=-1, keepdim=True)
    numerator = (x[..., 1:] * x[..., :-1]).sum()
    denominator = (x * x).sum().clamp_min(1e-30)
    return float(numerator / denominator)


def column_correlations(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pearson's correlation of each column of ``x`` (N, D) with ``y`` (N,), in float64; 0 for
    a constant column."""
    x, y = x.double() - x.double().mean(0), y.double() - y.double().mean()
    return (x * y[:, None]).sum(0) / (x.norm(dim=0) * y.norm()).clamp_min(1e-30)
