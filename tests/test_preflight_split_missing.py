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
