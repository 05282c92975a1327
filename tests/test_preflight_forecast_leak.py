"""FORECAST_LEAK: a next-step forecaster whose symmetric 'same' padding lets the prediction at
t read the input at t + 1; causal (left-padded) convolutions and a non-forecasting
regression on sequences stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.forecast_leak import ForecastLeakCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


class ConvForecaster(nn.Module):
    def __init__(self, causal: bool, k: int = 5):
        super().__init__()
        torch.manual_seed(0)
        self.causal, self.k = causal, k
        self.conv1, self.conv2 = nn.Conv1d(1, 8, k, padding=0 if causal else k // 2), nn.Conv1d(8, 1, 1)

    def forward(self, x):
        h = x.unsqueeze(1)
        if self.causal:
            h = nn.functional.pad(h, (self.k - 1, 0))
        return self.conv2(torch.relu(self.conv1(h))).squeeze(1)


SERIES = torch.sin(torch.linspace(0, 30, 33))[None].repeat(256, 1) + 0.1 * torch.randn(256, 33)


@pytest.mark.parametrize("causal, objective, fires", [
    (False, "next_step", True), (True, "next_step", False), (False, "denoise_same_step", False)])
def test_a_forecaster_that_reads_the_value_it_forecasts(causal, objective, fires):
    def loss(model, batch):
        series = batch[0]
        if objective == "next_step":
            return nn.functional.mse_loss(model(series[:, :-1]), series[:, 1:])
        return nn.functional.mse_loss(model(series), series.roll(1, dims=0))

    model = ConvForecaster(causal)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(SERIES), batch_size=32, shuffle=True), loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), ForecastLeakCheck()])
    assert bool(report.check("step.forecast_leak").issues) == fires
