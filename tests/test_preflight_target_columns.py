"""step.targets: TARGET_COLUMN_SCALES, a (B, K) regression target whose columns sit on scales far
apart under one loss (the narrow column is left at its mean), quiet on targets of one kind."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, TargetsCheck

G = torch.Generator().manual_seed(0)
X = torch.randn(512, 8, generator=G)


def run(targets: torch.Tensor, loss_fn=None):
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, targets.shape[1]))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(X, targets), batch_size=64, shuffle=True),
                           loss_fn=loss_fn or nn.MSELoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    return [i for i in report.check("step.targets").issues if i.code == "TARGET_COLUMN_SCALES"]


def test_a_price_beside_a_rate_under_one_mse_fires():
    price, rate = 40 * (X[:, 0] + X[:, 1]), 0.05 * torch.sin(2 * X[:, 2]) * X[:, 3]
    (issue,) = run(torch.stack([price, rate], 1))
    assert "column 0" in issue.message and "column 1" in issue.message and "of the loss" in issue.message
    assert "y.std(0)" in issue.fix


def test_the_same_under_l1_fires():
    assert run(torch.stack([300 * X[:, 0], 0.1 * X[:, 1]], 1), nn.L1Loss())


@pytest.mark.parametrize("targets, loss_fn", [
    (torch.stack([X[:, 0], 0.5 * X[:, 1], 2 * X[:, 2]], 1), None),  # standardised-ish columns
    (torch.rand(512, 4, generator=G), None),  # normalised box corners
    (torch.stack([X[:, 0], (torch.rand(512, generator=G) < 0.02).float() * 0.01], 1), None),  # a rare flag
    (torch.cumsum(torch.randn(512, 12, generator=G), 1), None),  # forecast horizons of one series
    (torch.stack([40 * X[:, 0], 0.05 * X[:, 1]], 1),  # weighted per column by hand
     lambda model, batch: (F.mse_loss(model(batch[0]), batch[1], reduction="none")
                           / torch.tensor([1600.0, 0.0025])).mean()),
], ids=["similar_scales", "boxes", "rare_flag", "horizons", "weighted_per_column"])
def test_targets_of_one_kind_or_weighted_columns_are_quiet(targets, loss_fn):
    assert run(targets, loss_fn) == []


def test_raw_prices_are_named_with_their_mean_spread_and_how_far_the_predictions_fall_short():
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    prices = (250_000 + 60_000 * X[:, :1]).clone()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(X, prices), batch_size=64, shuffle=True), loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    (issue,) = [i for i in report.check("step.targets").issues if i.code == "TARGET_SCALE"]
    assert "(mean 2." in issue.message and "std " in issue.message and "x too small" in issue.message
    assert "(y - y_mean) / y_std" in issue.fix


@pytest.mark.parametrize("precision, offset, fires", [("bf16", 5000.0, True), ("fp32", 5000.0, False),
                                                      ("bf16", 0.0, False)], ids=["bf16_offset", "fp32", "bf16_centred"])
def test_a_bf16_head_around_a_large_offset_cannot_resolve_the_targets(precision, offset, fires):
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))
    with torch.no_grad():
        model[2].bias.fill_(offset)  # the head starts at the targets' level, as a careful user sets it
    load = offset + 30 * X[:, 0]  # megawatts: a level of 5000 that swings by 30
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(X, load), batch_size=64, shuffle=True), loss_fn=nn.MSELoss(),
                           precision=precision, checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    found = [i for i in report.check("step.targets").issues if i.code == "OUTPUT_PRECISION_COARSE"]
    assert bool(found) == fires
    if found:
        assert "bfloat16" in found[0].message and "32 apart" in found[0].message


class FieldHead(nn.Module):
    """(B, 8) parameters -> (B, 2, 16) fields."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, x):
        return self.net(x).view(-1, 2, 16)


def fields(pressure_scale: float) -> torch.Tensor:
    grid = torch.linspace(0, 1, 16)
    pressure = pressure_scale * (X[:, :1] + torch.sin(3 * grid) * X[:, 1:2])
    velocity = 0.3 * torch.cos(2 * grid) * X[:, 2:3]
    return torch.stack([pressure, velocity], 1)


@pytest.mark.parametrize("pressure_scale", [1000.0, 1.0], ids=["pascals_beside_metres_per_second", "normalised"])
def test_field_channels_in_their_own_units_under_one_mse(pressure_scale):
    model = FieldHead()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(X, fields(pressure_scale)), batch_size=64, shuffle=True),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    found = [i for i in report.check("step.targets").issues if i.code == "TARGET_COLUMN_SCALES"]
    if pressure_scale == 1.0:
        assert not found
    else:
        assert "2 fields on scales far apart" in found[0].message and "channel_std" in found[0].fix
