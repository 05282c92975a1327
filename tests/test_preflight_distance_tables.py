"""step.distance_tables, TRIPLET_ON_DISTANCE_TABLES: a triplet loss on torch.cdist tables of every
pair; per-triplet distances, the cdist diagonal and batch-hard mining stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.distance_tables import DistanceTablesCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def triplet(kind: str):
    def loss_fn(model, batch):
        anchor, positive, negative = (model(part) for part in batch)
        if kind == "tables":
            return F.relu(torch.cdist(anchor, positive) - torch.cdist(anchor, negative) + 0.5).mean()
        if kind == "diagonal":
            return F.relu(torch.cdist(anchor, positive).diagonal() - torch.cdist(anchor, negative).diagonal() + 0.5).mean()
        if kind == "batch_hard":
            table = torch.cdist(anchor, anchor)
            return F.relu(table.max(1).values - table.min(1).values + 0.5).mean()
        return F.triplet_margin_loss(anchor, positive, negative, margin=0.5)
    return loss_fn


@pytest.mark.parametrize("kind", ["tables", "diagonal", "batch_hard", "per_triplet"])
def test_a_triplet_loss_on_tables_of_every_pair(kind):
    g = torch.Generator().manual_seed(0)
    rows = TensorDataset(*(torch.randn(256, 12, generator=g) for _ in range(3)))
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 8))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(rows, batch_size=32),
                           loss_fn=triplet(kind), checks=[FirstBatchCheck(), FirstStepCheck(), DistanceTablesCheck()])
    issues = report.check("step.distance_tables").issues
    assert bool(issues) == (kind == "tables")
    if issues:
        assert "(32, 32)" in issues[0].message and "F.pairwise_distance" in issues[0].fix
