"""TRAIN_ONLY_FEATURE: a tabular column that predicts the label in training and far less in
validation: a smoothed target encoding computed with each row's own label (binary labels as
floats), a regression feature filled from the label for the training rows. A column that is
predictive in both splits, the leave-one-out encoding, and a run without validation stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.column_shortcut import train_only_column
from optimus_preflight.preflight.checks.column_shortcut import TrainOnlyColumnCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck

ROWS, TRAIN = 3000, 2400


def encoded_table(leave_one_out: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    merchant = torch.randint(0, 2400, (ROWS,), generator=g)  # 1-2 training rows per merchant
    x = torch.randn(ROWS, 5, generator=g)
    y = ((x @ torch.randn(5, generator=g)) * 0.5 + torch.randn(ROWS, generator=g) > 0).float()
    train = torch.arange(TRAIN)
    sums = torch.zeros(2400).index_add_(0, merchant[train], y[train])
    counts = torch.zeros(2400).index_add_(0, merchant[train], torch.ones(TRAIN))
    prior = y[train].mean()
    own = y[train] if leave_one_out else 0
    encoded_train = (sums[merchant[train]] - own + prior) / (counts[merchant[train]] - (1 if leave_one_out else 0) + 1)
    encoded_val = (sums[merchant[TRAIN:]] + prior) / (counts[merchant[TRAIN:]] + 1)
    return (torch.cat([x[train], encoded_train[:, None]], 1), y[train],
            torch.cat([x[TRAIN:], encoded_val[:, None]], 1), y[TRAIN:])


def issues(train_x, train_y, val_x, val_y, with_val: bool = True) -> dict:
    model = nn.Linear(train_x.shape[1], 1)
    val_loader = DataLoader(TensorDataset(val_x, val_y), batch_size=200) if with_val else None
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(train_x, train_y), batch_size=64, shuffle=True),
                           loss_fn=nn.BCEWithLogitsLoss(), val_loader=val_loader,
                           checks=[FirstBatchCheck(), TrainOnlyColumnCheck()])
    return {i.code: i for i in report.check("data.train_only_column").issues}


def test_a_target_encoding_holding_each_rows_own_label_is_named():
    issue = issues(*encoded_table(leave_one_out=False))["TRAIN_ONLY_FEATURE"]
    assert "feature column 5" in issue.message and "AUC for class 1" in issue.message
    assert "leave-one-out" in issue.fix


def test_a_leave_one_out_encoding_and_a_run_without_validation_stay_quiet():
    assert issues(*encoded_table(leave_one_out=True)) == {}
    assert issues(*encoded_table(leave_one_out=False), with_val=False) == {}


def test_a_regression_feature_filled_from_the_label_in_training_only():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2000, 4, generator=g)
    y = x[:, 0] + torch.randn(2000, generator=g)
    filled = torch.where(torch.arange(2000) < 1500, y + 0.1 * torch.randn(2000, generator=g), x[:, 3])
    table = torch.cat([x[:, :3], filled[:, None]], 1)
    found = train_only_column(table[:1500], y[:1500], table[1500:], y[1500:])
    assert found is not None and found.column == 3 and found.measure == "Spearman correlation"


@pytest.mark.parametrize("labels", ["binary", "continuous"])
def test_a_column_predictive_in_both_splits_stays_quiet(labels):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2000, 4, generator=g)
    signal = x[:, 0] * 3 + 0.3 * torch.randn(2000, generator=g)
    y = (signal > 0).float() if labels == "binary" else signal
    assert train_only_column(x[:1500], y[:1500], x[1500:], y[1500:]) is None
