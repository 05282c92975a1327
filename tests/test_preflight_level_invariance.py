"""step.level_invariance: a forecaster that normalises each window by its own statistics and
returns the forecast without the inverse fires OUTPUT_IGNORES_LEVEL beside targets on the
series' level; the same model with the inverse, and targets that do not follow the level, stay
quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.level_invariance import LevelInvarianceCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


class InstanceNormForecaster(nn.Module):
    def __init__(self, denormalise: bool):
        super().__init__()
        self.denormalise = denormalise
        self.net = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        mu, sd = x.mean(1, keepdim=True), x.std(1, keepdim=True) + 1e-3
        out = self.net((x - mu) / sd)
        return out * sd + mu if self.denormalise else out


def series_windows(levels: bool):
    g = torch.Generator().manual_seed(0)
    level = torch.rand(64, 1, generator=g) * 50 if levels else torch.zeros(64, 1)
    t = torch.arange(60, dtype=torch.float32)
    series = level + torch.sin(t / 3 + torch.rand(64, 1, generator=g) * 6) + 0.1 * torch.randn(64, 60, generator=g)
    x = torch.cat([series[:, i:i + 24] for i in range(0, 32, 4)])
    y = torch.cat([series[:, i + 24:i + 28] for i in range(0, 32, 4)])
    return x, y


@pytest.mark.parametrize("denormalise, levels, fires", [(False, True, True), (True, True, False),
                                                        (False, False, False)],
                         ids=["no_inverse", "with_inverse", "no_levels"])
def test_a_forecast_left_in_normalised_units(denormalise, levels, fires):
    x, y = series_windows(levels)
    torch.manual_seed(0)
    model = InstanceNormForecaster(denormalise)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), LevelInvarianceCheck()])
    issues = report.check("step.level_invariance").issues
    assert [i.code for i in issues] == (["OUTPUT_IGNORES_LEVEL"] if fires else [])
    if issues:
        assert "out * sd + mu" in issues[0].fix


def test_a_loss_that_normalises_windows_and_targets_with_the_windows_statistics_is_quiet():
    x, y = series_windows(levels=True)
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 4))

    def normalised_mse(m, batch):  # the model sees normalised windows; the target is put on the same scale
        xb, yb = batch
        mu, sd = xb.mean(1, keepdim=True), xb.std(1, keepdim=True) + 1e-3
        return ((m((xb - mu) / sd) - (yb - mu) / sd) ** 2).mean()

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), loss_fn=normalised_mse,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LevelInvarianceCheck()])
    result = report.check("step.level_invariance")
    assert result.issues == [] and result.data["output_moved"] < 1e-3 * result.data["shift"]
