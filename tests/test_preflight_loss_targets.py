"""step.loss_targets: a loss that standardises each target row with its own mean and std fires
TARGETS_NORMALISED_IN_LOSS; the same loss with the input window's statistics stays quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.loss_targets import LossTargetsCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def normalised_mse(own_statistics: bool):
    def loss_fn(model, batch):
        x, y = batch
        mu, sd = x.mean(1, keepdim=True), x.std(1, keepdim=True) + 1e-3
        y_mu, y_sd = (y.mean(1, keepdim=True), y.std(1, keepdim=True) + 1e-3) if own_statistics else (mu, sd)
        return ((model((x - mu) / sd) - (y - y_mu) / y_sd) ** 2).mean()
    return loss_fn


@pytest.mark.parametrize("own_statistics", [True, False])
def test_targets_standardised_by_their_own_statistics_in_the_loss(own_statistics):
    g = torch.Generator().manual_seed(0)
    series = torch.rand(64, 1, generator=g) * 30 + torch.randn(64, 40, generator=g).cumsum(1)
    x = torch.cat([series[:, i:i + 24] for i in range(0, 12, 4)])
    y = torch.cat([series[:, i + 24:i + 28] for i in range(0, 12, 4)])
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 4))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                           loss_fn=normalised_mse(own_statistics),
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossTargetsCheck()])
    issues = report.check("step.loss_targets").issues
    assert [i.code for i in issues] == (["TARGETS_NORMALISED_IN_LOSS"] if own_statistics else [])
    if issues:
        assert "(y - mu) / sd" in issues[0].fix
