"""step.pooled_axis: POOLED_AXIS_CARRIES_LABEL, a model that averages its (B, A, C) input over the
axis its labels depend on (a spectrogram pooled over the mel bins instead of time); pooling over
time, and a model that reads both axes, stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks import pooled_axis
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def tones(n: int = 1200, mels: int = 24, frames: int = 24):
    """The class is a frequency band, switched on at a random time."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, mels, frames, generator=g), torch.randint(0, 4, (n,), generator=g)
    for i in range(n):
        band, start = 2 + 5 * int(y[i]), int(torch.randint(0, frames - 8, (1,), generator=g))
        x[i, band:band + 2, start:start + 8] += 2.5
    return x, y


class Pooled(nn.Module):
    def __init__(self, dim: int | None, side: int = 24):
        super().__init__()
        self.dim = dim
        self.head = nn.Sequential(nn.Linear(side if dim else side * side, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.head(x.mean(self.dim) if self.dim else x.flatten(1))


@pytest.mark.parametrize("dim, fires", [(1, True), (2, False), (None, False)],
                         ids=["over_the_mel_bins", "over_time", "no_pooling"])
def test_pooling_away_the_axis_that_names_the_class(monkeypatch, dim, fires):
    monkeypatch.setattr(pooled_axis, "BUDGET_S", 600.0)  # the read is judged by samples, not by this machine's speed
    x, y = tones()
    model = Pooled(dim)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), pooled_axis.PooledAxisCheck()])
    issues = report.check("step.pooled_axis").issues
    assert bool(issues) == fires, report.check("step.pooled_axis").data
    if issues:
        assert "over dim 1" in issues[0].message and "x.mean(dim=2)" in issues[0].fix
