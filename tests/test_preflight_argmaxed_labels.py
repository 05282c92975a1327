"""TARGET_MULTI_HOT for class targets argmaxed from multi-hot labels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import TargetsCheck


def tagged_rows(rows: int, labels_per_row: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(rows, 20, generator=generator)
    tags = torch.zeros(rows, 6)
    for row in range(rows):
        count = int(torch.randint(1, labels_per_row + 1, (1,), generator=generator))
        tags[row, torch.randperm(6, generator=generator)[:count]] = 1.0
    return x, tags


def argmax_cross_entropy(model, batch):
    x, tags = batch
    return F.cross_entropy(model(x), tags.argmax(1))


@pytest.mark.parametrize("labels_per_row, fires", [(3, True), (1, False)], ids=["multi_hot", "one_hot"])
def test_argmax_of_multi_hot_labels_into_cross_entropy(labels_per_row, fires):
    x, tags = tagged_rows(512, labels_per_row, torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 6))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, tags), batch_size=32), loss_fn=argmax_cross_entropy,
                           checks=[FirstBatchCheck(), TargetsCheck()])
    issues = [i for i in report.check("step.targets").issues if i.code == "TARGET_MULTI_HOT"]
    assert bool(issues) == fires
    if issues:
        assert "argmax of the batch's multi-hot (32, 6) labels" in issues[0].message
        assert "BCEWithLogitsLoss" in issues[0].fix


def test_multi_hot_labels_trained_with_bce_are_quiet():
    x, tags = tagged_rows(512, 3, torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 6))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, tags), batch_size=32), loss_fn=nn.BCEWithLogitsLoss(),
                           checks=[FirstBatchCheck(), TargetsCheck()])
    assert not report.check("step.targets").issues
