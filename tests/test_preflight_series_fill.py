"""SERIES_GAP_FILLED: windows of a temperature series whose sensor dropouts were filled with 0
(fillna(0)) fire, naming the targets that hold the fill value too. The same series forward
filled, intermittent counts with real zeros, and a signal that crosses 0 stay quiet."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.gap_fill import gap_fill
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.series_fill import SeriesFillCheck


def temperature(fill: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    t = torch.arange(3000, dtype=torch.float64)
    series = 20 + 3 * torch.sin(2 * math.pi * t / 24) + 0.2 * torch.randn(3000, generator=g, dtype=torch.float64)
    missing = torch.rand(3000, generator=g) < 0.15
    if fill == "zero":
        return torch.where(missing, torch.zeros_like(series), series).float()
    for i in range(1, 3000):  # forward fill
        if missing[i]:
            series[i] = series[i - 1]
    return series.float()


def windows(series: torch.Tensor, width: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    x = series.unfold(0, width + 1, 1)
    return x[:, :width].contiguous(), x[:, width:].contiguous()


def issues(series: torch.Tensor) -> dict:
    x, y = windows(series)
    model = nn.Linear(24, 1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           # A seeded order: whether the first batch's 32 targets hold a fill depends on the draw.
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True,
                                      generator=torch.Generator().manual_seed(0)), loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), SeriesFillCheck()])
    return {i.code: i for i in report.check("data.series_fill").issues}


def test_gaps_filled_with_zero_in_a_series_around_twenty_are_named():
    issue = issues(temperature("zero"))["SERIES_GAP_FILLED"]
    assert "the exact value 0 makes up" in issue.message and "fillna(0)" in issue.message
    assert "batch field 1 (the targets) holds it too" in issue.message and "forward fill" in issue.fix


def test_the_same_series_forward_filled_stays_quiet():
    assert issues(temperature("ffill")) == {}


@pytest.mark.parametrize("kind", ["intermittent_counts", "crossing_zero"])
def test_series_whose_real_values_include_the_constant_stay_quiet(kind):
    g = torch.Generator().manual_seed(1)
    if kind == "intermittent_counts":  # sales: many zero days, small counts otherwise
        series = torch.poisson(torch.full((3000,), 0.6), generator=g)
    else:  # a sine rounded to a coarse grid: exact zeros are real readings
        series = torch.round(torch.sin(torch.arange(3000) * 0.3) * 10) / 10
    x, _ = windows(series)
    assert gap_fill(x[:256]) is None


def test_forty_percent_of_a_noisy_series_filled_with_zero_is_named():
    # So many fills that a window whose fills stand in for the level looks rough: the
    # smoothness is judged between real readings only (every one of 30 random batches of this
    # series holds the fill and reads above 0.77 between readings).
    g = torch.Generator().manual_seed(2)
    t = torch.arange(3000, dtype=torch.float64)
    series = 8 + 1.5 * torch.sin(2 * math.pi * t / 24) + 0.3 * torch.randn(3000, generator=g, dtype=torch.float64)
    filled = torch.where(torch.rand(3000, generator=g) < 0.4, torch.zeros_like(series), series).float()
    issue = issues(filled)["SERIES_GAP_FILLED"]
    assert "the exact value 0 makes up" in issue.message
