"""step.selection_alignment, PREDICTIONS_TARGETS_SELECTED_APART: out[:n_train] against
y[train_idx] in a node classifier; the same index on both sides, two masks of one split and a
shifted next-token objective over one stream stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.selection_alignment import SelectionAlignmentCheck, mismatch
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def graph():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 8, generator=g)
    y = (x @ torch.randn(8, 3, generator=g)).argmax(1)
    train_index = torch.randperm(120, generator=g)[:60]
    return x, torch.eye(120), y, train_index


@pytest.mark.parametrize("selection, fires", [("prefix", True), ("index", False), ("mask", False)])
def test_predictions_and_labels_picked_apart(selection, fires):
    model = nn.Linear(8, 3)

    def node_loss(model, batch):
        x, adjacency, y, index = batch
        out = adjacency @ model(x)
        if selection == "prefix":
            return F.cross_entropy(out[:len(index)], y[index])
        if selection == "index":
            return F.cross_entropy(out[index], y[index])
        mask = torch.zeros(len(y), dtype=torch.bool)
        mask[index] = True
        return F.cross_entropy(out[mask], y[mask])

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2), DataLoader([graph()], batch_size=None),
                           loss_fn=node_loss, checks=[FirstBatchCheck(), FirstStepCheck(), SelectionAlignmentCheck()])
    issues = report.check("step.selection_alignment").issues
    assert bool(issues) == fires
    if issues:
        assert "rows 0..59 (a slice)" in issues[0].message and "out[train_idx], y[train_idx]" in issues[0].fix


def test_a_shifted_objective_over_one_stream_is_no_misalignment():
    rows = 64
    assert mismatch([(rows, torch.arange(0, 63))], [(rows, torch.arange(1, 64))]) is None
    assert mismatch([(rows, torch.arange(0, 32))], [(rows, torch.randperm(rows)[:32])]) is not None
