"""data.split_missing: LABELS_MISSING_FILLED, multi-task labels kept as NaN in validation but
filled with 0 in training; NaN kept in both splits, and complete labels, stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.split_missing import SplitMissingCheck


def assays(n: int, seed: int, missing: float):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, generator=g)
    y = (x[:, :4] > 0).float()
    return x, torch.where(torch.rand(n, 4, generator=g) < missing, torch.full_like(y, float("nan")), y)


def masked_bce(model, batch):
    x, y = batch
    known = ~torch.isnan(y)
    return F.binary_cross_entropy_with_logits(model(x)[known], y[known])


@pytest.mark.parametrize("train_labels, missing, fires", [("filled", 0.6, True), ("nan", 0.6, False),
                                                          ("filled", 0.0, False)])
def test_missing_training_labels_filled_with_zero(train_labels, missing, fires):
    x, y = assays(1024, 0, missing)
    vx, vy = assays(512, 1, missing)
    if train_labels == "filled":
        y = torch.nan_to_num(y, nan=0.0)
    model = nn.Linear(12, 4)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(vx, vy), batch_size=128), loss_fn=masked_bce,
                           checks=[FirstBatchCheck(), SplitMissingCheck()])
    found = [i for i in report.check("data.split_missing").issues if i.code == "LABELS_MISSING_FILLED"]
    assert len(found) == int(fires)
    if fires:
        assert "filled with 0" in found[0].message and "~torch.isnan(y)" in found[0].fix


def masked_mse(model, batch):
    x, y, observed = batch
    return ((model(x) - y) ** 2 * observed).sum() / observed.sum()


def two_tasks(n: int, seed: int):
    """Two regression targets; the second is missing (NaN) on 60% of the rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = torch.stack([torch.tanh(x[:, 0]), 3 + torch.sin(x[:, 1])], 1) + 0.1 * torch.randn(n, 2, generator=g)
    y[torch.rand(n, generator=g) < 0.6, 1] = float("nan")
    return x, y


@pytest.mark.parametrize("mask_after_fill", [True, False])
def test_a_mask_of_observed_targets_taken_after_the_fill(mask_after_fill):
    x, y_raw = two_tasks(1024, 0)
    vx, vy_raw = two_tasks(512, 1)
    y = torch.nan_to_num(y_raw, nan=0.0)
    observed = (~torch.isnan(y if mask_after_fill else y_raw)).float()
    val_observed = (~torch.isnan(vy_raw)).float()
    model = nn.Linear(8, 2)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y, observed), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(vx, torch.nan_to_num(vy_raw), val_observed),
                                                 batch_size=128),
                           loss_fn=masked_mse, checks=[FirstBatchCheck(), SplitMissingCheck()])
    found = report.check("data.split_missing").issues
    assert [i.code for i in found] == (["LABELS_MISSING_FILLED"] if mask_after_fill else [])
    if mask_after_fill:
        assert "computed after the missing labels were filled" in found[0].message
        assert "observed = ~torch.isnan(y_raw)" in found[0].fix
