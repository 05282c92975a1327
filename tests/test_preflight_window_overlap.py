"""data.window_overlap: sliding windows of one series split at random between training and
validation (WINDOWS_SPLIT_AT_RANDOM), with stride 1 and 2 and with (T, F) windows; a split in
time and windows of separate series stay quiet."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.window_overlap import WindowOverlapCheck
from tests.preflight_support import assert_quiet


def load_windows(stride: int = 1, features: int = 0, width: int = 24):
    g = torch.Generator().manual_seed(0)
    t = torch.arange(4000, dtype=torch.float32)
    series = torch.sin(2 * math.pi * t / 24) + 0.1 * torch.randn(4000, generator=g)
    if features:
        series = torch.stack([series + 0.1 * k for k in range(features)], 1)
    starts = range(0, len(series) - width - 1, stride)
    return torch.stack([series[i:i + width] for i in starts]), torch.stack([series[i + width] for i in starts])


def run(train, val):
    x = train[0]
    model = nn.Sequential(nn.Flatten(), nn.Linear(x[0].numel(), 16), nn.ReLU(), nn.Linear(16, train[1][0].numel()))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(*train), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(*val), batch_size=128),
                           loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1].reshape(len(b[1]), -1)),
                           checks=[FirstBatchCheck(), WindowOverlapCheck()])
    return report.check("data.window_overlap")


@pytest.mark.parametrize("stride, features", [(1, 0), (2, 0), (1, 3)], ids=["stride_1", "stride_2", "multivariate"])
def test_windows_split_at_random_fire(stride, features):
    x, y = load_windows(stride, features)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    cut = int(0.8 * len(x))
    result = run((x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]]))
    issues = [i for i in result.issues if i.code == "WINDOWS_SPLIT_AT_RANDOM"]
    assert issues, result.data
    assert f"all but {stride} of their 24 steps" in issues[0].message and "Split by time" in issues[0].fix


def test_a_split_in_time_stays_quiet():
    x, y = load_windows()
    cut = int(0.8 * len(x))
    result = run((x[:cut], y[:cut]), (x[cut:], y[cut:]))
    assert_quiet(result)
    assert result.data["overlapping"] <= 23  # only the windows that straddle the boundary


def test_windows_of_other_series_stay_quiet():
    x, y = load_windows()
    other_x, other_y = x + 0.01, y + 0.01  # another meter: no shared values
    assert_quiet(run((x[:2000], y[:2000]), (other_x[2000:2600], other_y[2000:2600])))


def test_rows_of_a_few_repeated_counts_split_at_random_stay_quiet():
    # Hashed bag-of-words counts in 14 buckets: mostly zeros and ones, so a row's shifted part
    # often equals another row's by chance, and its unshifted part just as often.
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(3000, 14)
    words = torch.randint(0, 14, (3000, 3), generator=g)
    counts.scatter_add_(1, words, torch.ones(3000, 3))
    labels = (counts[:, 2] > 0).float()
    order = torch.randperm(3000, generator=g)
    train, val = order[:2500], order[2500:]
    assert_quiet(run((counts[train], labels[train]), (counts[val], labels[val])))
