"""step.target_alignment: a pinball loss that unsqueezes (B, H) targets at dim 1 against (B, H, Q)
quantile outputs with H == Q fires TARGET_AXIS_MISALIGNED; unsqueeze(-1), an MSE over a
(B, H, K) sample head and an output axis of another length stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.checks.target_alignment import TargetAlignmentCheck


class QuantileHead(nn.Module):
    def __init__(self, horizon: int, quantiles: int):
        super().__init__()
        self.shape = (horizon, quantiles)
        self.net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, horizon * quantiles))

    def forward(self, x):
        return self.net(x).view(-1, *self.shape)


def pinball(dim: int):
    levels = torch.tensor([0.1, 0.5, 0.9])

    def loss_fn(model, batch):
        x, y = batch
        e = y.unsqueeze(dim) - model(x)
        return torch.maximum(levels * e, (levels - 1) * e).mean()
    return loss_fn


def mse_over_samples(model, batch):
    x, y = batch
    return ((model(x) - y[..., None]) ** 2).mean()


@pytest.mark.parametrize("loss_fn, horizon, quantiles, fires", [
    (pinball(1), 3, 3, True), (pinball(-1), 3, 3, False), (mse_over_samples, 3, 3, False),
    (pinball(-1), 4, 3, False)], ids=["unsqueeze_1", "unsqueeze_last", "mse_samples", "other_lengths"])
def test_a_target_broadcast_against_the_quantile_axis(loss_fn, horizon, quantiles, fires):
    g = torch.Generator().manual_seed(0)
    series = torch.randn(256, 12 + horizon, generator=g).cumsum(1)
    torch.manual_seed(0)
    model = QuantileHead(horizon, quantiles)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(series[:, :12], series[:, 12:]), batch_size=32, shuffle=True),
                           loss_fn=loss_fn, checks=[FirstBatchCheck(), FirstStepCheck(), TargetAlignmentCheck()])
    result = report.check("step.target_alignment")
    assert [i.code for i in result.issues] == (["TARGET_AXIS_MISALIGNED"] if fires else []), result.data
    if fires:
        assert "y.unsqueeze(-1) - pred" in result.issues[0].fix and "(32, 3, 3) beside (32, 3)" in result.issues[0].message
    elif horizon == quantiles:
        assert result.data["loss_at_targets"] == pytest.approx(0.0, abs=1e-6)
