"""TARGET_MASK_UNUSED: placeholder labels trained because the batch's label mask is never read."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.checks.unread_mask import UnreadMaskCheck


def partly_labelled_graphs(graphs: int = 64, nodes: int = 20, classes: int = 4):
    g = torch.Generator().manual_seed(0)
    truth = torch.randint(0, classes, (graphs, nodes), generator=g)
    x = F.one_hot(truth, classes).float() + 0.5 * torch.randn(graphs, nodes, classes, generator=g)
    adjacency = (torch.rand(graphs, nodes, nodes, generator=g) < 0.2).float() + torch.eye(nodes)
    adjacency = adjacency / adjacency.sum(-1, keepdim=True)
    labelled = torch.rand(graphs, nodes, generator=g) < 0.2  # 80% of the nodes carry no label
    return TensorDataset(x, adjacency, torch.where(labelled, truth, torch.zeros_like(truth)), labelled)


class MeanAggregation(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 4)

    def forward(self, x, adjacency):
        return self.layer(torch.cat([x, adjacency @ x], -1))


def node_loss(use_mask: bool):
    def loss_fn(model, batch):
        x, adjacency, y, labelled = batch
        logits = model(x, adjacency)
        if use_mask:
            return F.cross_entropy(logits[labelled], y[labelled])
        return F.cross_entropy(logits.reshape(-1, 4), y.reshape(-1))
    return loss_fn


@pytest.mark.parametrize("use_mask", [False, True], ids=["mask_never_read", "mask_applied"])
def test_a_node_loss_that_never_reads_its_train_mask(use_mask):
    model = MeanAggregation()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(partly_labelled_graphs(), batch_size=16, shuffle=True), loss_fn=node_loss(use_mask),
                           checks=[FirstBatchCheck(), FirstStepCheck(), UnreadMaskCheck()])
    result = report.check("step.unread_mask")
    issues = [i for i in result.issues if i.code == "TARGET_MASK_UNUSED"]
    assert bool(issues) == (not use_mask), result.data
    if issues:
        assert "every target is 0" in issues[0].message and "logits[mask], y[mask]" in issues[0].fix


def test_a_mask_the_model_reads_is_quiet():
    # An attention-style mask the model consumes, beside labels that are 0 where it is False.
    model = MeanAggregation()

    def masked_inputs(model, batch):
        x, adjacency, y, labelled = batch
        return F.cross_entropy(model(x * labelled[..., None], adjacency).reshape(-1, 4), y.reshape(-1))

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(partly_labelled_graphs(), batch_size=16), loss_fn=masked_inputs,
                           checks=[FirstBatchCheck(), FirstStepCheck(), UnreadMaskCheck()])
    assert not report.check("step.unread_mask").issues
