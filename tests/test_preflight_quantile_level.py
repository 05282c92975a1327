"""step.quantile_level: QUANTILE_LEVEL_SWAPPED, a pinball loss that fits the (1 - q)-th quantile
of the q it declares; the right pinball loss, a median loss and an MSE stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.quantile_level import QuantileLevelCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def pinball(q: float, swapped: bool):
    def loss_fn(model, batch):
        x, y = batch
        err = y - model(x)
        if swapped:
            return torch.maximum((1 - q) * err, -q * err).mean()
        return torch.maximum(q * err, (q - 1) * err).mean()
    return loss_fn


class Pinball:
    """The same as a callable object with its level as an attribute."""

    def __init__(self, tau: float):
        self.tau = tau

    def __call__(self, model, batch):
        err = model(batch[0]) - batch[1]  # prediction - y: the other sign convention, swapped
        return torch.maximum(self.tau * err, (self.tau - 1) * err).mean()


TAU = 0.9  # a module constant the loss names


def flipped_with_module_constant(model, batch):
    err = model(batch[0]) - batch[1]  # prediction - y
    return torch.maximum(TAU * err, (TAU - 1) * err).mean()


def flipped_with_default(model, batch, tau=0.9):
    err = model(batch[0]) - batch[1]
    return torch.maximum(tau * err, (tau - 1) * err).mean()


def run(loss_fn):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 4, generator=g)
    y = x[:, 0] + torch.exp(x[:, 1]) * torch.randn(512, generator=g)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1), nn.Flatten(0))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=128, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), QuantileLevelCheck()])
    return report.check("step.quantile_level")


@pytest.mark.parametrize("loss_fn", [pinball(0.9, swapped=True), Pinball(0.9), flipped_with_module_constant,
                                     flipped_with_default], ids=["closure", "attribute", "module_constant", "default"])
def test_a_pinball_loss_with_q_and_1_minus_q_swapped_fires(loss_fn):
    (issue,) = run(loss_fn).issues
    assert issue.code == "QUANTILE_LEVEL_SWAPPED" and "trained towards P10" in issue.message
    assert "torch.maximum(q * e, (q - 1) * e)" in issue.fix


@pytest.mark.parametrize("loss_fn", [pinball(0.9, swapped=False), pinball(0.5, swapped=True), pinball(0.1, False)],
                         ids=["p90", "median", "p10"])
def test_the_right_pinball_loss_and_a_median_loss_are_quiet(loss_fn):
    result = run(loss_fn)
    assert result.issues == [], result.data


class QuantileHead(nn.Module):
    """Three quantiles per sample, the levels kept on the model."""

    def __init__(self):
        super().__init__()
        self.quantiles = (0.1, 0.5, 0.9)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


def head_pinball(swapped: bool):
    def loss_fn(model, batch):
        x, y = batch
        levels = torch.tensor(model.quantiles)
        pred = model(x)
        err = pred - y[:, None] if swapped else y[:, None] - pred
        return torch.maximum(levels * err, (levels - 1) * err).mean()
    return loss_fn


@pytest.mark.parametrize("swapped", [True, False])
def test_a_head_of_quantiles_is_judged_column_by_column(swapped):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 4, generator=g)
    y = x[:, 0] + torch.exp(x[:, 1]) * torch.randn(512, generator=g)
    torch.manual_seed(0)
    model = QuantileHead()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=128, shuffle=True), loss_fn=head_pinball(swapped),
                           checks=[FirstBatchCheck(), FirstStepCheck(), QuantileLevelCheck()])
    result = report.check("step.quantile_level")
    assert "quantiles=[0.1, 0.5, 0.9] declared" in result.data["summary"]
    if not swapped:
        assert result.issues == [], result.data
        return
    (issue,) = result.issues
    assert issue.code == "QUANTILE_LEVEL_SWAPPED"
    assert "column 0 (quantiles[0]=0.1) at the 0.9" in issue.message and "column 2 (quantiles[2]=0.9)" in issue.message
    assert "y[:, None] - pred" in issue.fix
