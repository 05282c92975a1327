"""CHANNEL_AXIS_REDUCED: an NCHW conv map reduced over its channel axis and one spatial axis
(Keras' NHWC global-pool axes); a global pool over (2, 3), CBAM's channel mean and a real
NHWC map pooled over (1, 2) stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.channel_axis import ChannelAxisWatch
from optimus_preflight.preflight.checks.batch_layout import BatchLayoutCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck


class PooledCNN(nn.Module):
    def __init__(self, pool):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.pool, self.head = pool, nn.Linear(16, 4)

    def forward(self, x):  # (B, 3, 16, 16): the width equals the channel count
        return self.head(self.pool(self.features(x)))


def cbam_then_global(h):
    attention = torch.sigmoid(h.mean(dim=1, keepdim=True) + h.amax(dim=1, keepdim=True))
    return (h * attention).mean(dim=(2, 3))


POOLS = {
    "keras_axes": (lambda h: h.mean(dim=(1, 2)), True),
    "keras_axes_negative": (lambda h: h.amax(dim=(-3, -2)), True),
    "global_pool": (lambda h: h.mean(dim=(2, 3)), False),
    "cbam_then_global": (cbam_then_global, False),
    "nhwc_then_keras_axes": (lambda h: h.permute(0, 2, 3, 1).mean(dim=(1, 2)), False),
    "adaptive_pool": (lambda h: nn.functional.adaptive_avg_pool2d(h, 1).flatten(1), False),
}


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_channel_and_one_spatial_axis_reduced_fires_and_real_pools_stay_quiet(pool):
    function, fires = POOLS[pool]
    x, y = torch.randn(256, 3, 16, 16), torch.randint(0, 4, (256,))
    model = PooledCNN(function)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), BatchLayoutCheck()])
    issues = [i for i in report.check("step.batch_layout").issues if i.code == "CHANNEL_AXIS_REDUCED"]
    assert bool(issues) == fires
    if fires:
        assert "mean(dim=(2, 3))" in issues[0].fix and "NHWC" in issues[0].message


class SensorCNN(nn.Module):
    """(B, 3, 64) accelerometer windows through two Conv1d layers, a pool, a head sized for it."""

    def __init__(self, pool, width):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Conv1d(3, 32, 7, padding=3), nn.ReLU(), nn.Conv1d(32, 32, 5, padding=2),
                                      nn.BatchNorm1d(32), nn.ReLU())
        self.pool, self.head = pool, nn.Linear(width, 5)

    def forward(self, x):
        return self.head(self.pool(self.features(x)))


POOLS_1D = {
    "mean_over_filters": (lambda h: h.mean(dim=1), 64, True),
    "global_pool_over_time": (lambda h: h.mean(dim=2), 32, False),
    "adaptive_pool": (lambda h: nn.functional.adaptive_max_pool1d(h, 1).flatten(1), 32, False),
    "channel_attention_then_pool": (lambda h: (h * torch.sigmoid(h.mean(dim=1, keepdim=True))).mean(-1), 32, False),
}


@pytest.mark.parametrize("pool", sorted(POOLS_1D))
def test_a_conv1d_map_pooled_over_its_filters(pool):
    function, width, fires = POOLS_1D[pool]
    x, y = torch.randn(256, 3, 64), torch.randint(0, 5, (256,))
    model = SensorCNN(function, width)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), BatchLayoutCheck()])
    issues = [i for i in report.check("step.batch_layout").issues if i.code == "CHANNEL_AXIS_REDUCED"]
    assert bool(issues) == fires
    if fires:
        assert "Conv1d over its channel (filter) axis" in issues[0].message and "h.mean(dim=2)" in issues[0].fix


def test_the_watch_forgets_a_map_once_its_layout_changes():
    watch = ChannelAxisWatch()
    conv = torch.randn(2, 8, 8, 8)
    watch.observe("conv2d", (torch.randn(2, 3, 8, 8),), {}, conv)
    nhwc = conv.permute(0, 2, 3, 1)
    watch.observe("permute", (conv, (0, 2, 3, 1)), {}, nhwc)
    watch.observe("mean", (nhwc, (1, 2)), {}, nhwc.mean((1, 2)))
    assert watch.found is None
    watch.observe("mean", (conv, (1, 3)), {}, conv.mean((1, 3)))
    assert watch.found is not None and watch.found.dims == (1, 3)
