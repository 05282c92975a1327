"""SCATTER_OVERWRITES: neighbour messages summed with scatter / index_copy, which keep one value
per node where several edges send one; scatter_add / index_add and a one-hot built with scatter_
stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck

NODES, FEATURES = 32, 8
EDGES = torch.randint(0, NODES, (2, 128), generator=torch.Generator().manual_seed(0))  # many nodes get several


class MessagePassing(nn.Module):
    def __init__(self, aggregate: str):
        super().__init__()
        torch.manual_seed(0)
        self.aggregate = aggregate
        self.message, self.readout = nn.Linear(FEATURES, FEATURES), nn.Linear(FEATURES, 3)

    def forward(self, x):  # x: (B, NODES, FEATURES), one graph per sample on the shared edges
        src, dst = EDGES
        messages = self.message(x[:, src])  # (B, E, F)
        index = dst.view(1, -1, 1).expand_as(messages)
        empty = torch.zeros_like(x)
        if self.aggregate == "scatter":
            nodes = empty.scatter(1, index, messages)
        elif self.aggregate == "index_copy":
            nodes = empty.index_copy(1, dst, messages)
        elif self.aggregate == "index_add":
            nodes = empty.index_add(1, dst, messages)
        else:
            nodes = empty.scatter_add(1, index, messages)
        return self.readout(F.relu(nodes).mean(1))


def one_hot_loss(model, batch):
    x, y = batch
    target = torch.zeros(len(y), 3).scatter_(1, y.unsqueeze(1), 1.0)  # one-hot: no gradient, one write per row
    return F.binary_cross_entropy_with_logits(model(x), target)


@pytest.mark.parametrize("aggregate, fires", [("scatter", True), ("index_copy", True), ("scatter_add", False),
                                              ("index_add", False)])
def test_messages_written_with_an_overwriting_scatter(aggregate, fires):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(128, NODES, FEATURES, generator=g), torch.randint(0, 3, (128,), generator=g)
    model = MessagePassing(aggregate)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True), loss_fn=one_hot_loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    found = [issue for issue in report.check("step.loss_function").issues if issue.code == "SCATTER_OVERWRITES"]
    assert bool(found) == fires
    if fires:
        assert aggregate in found[0].message and "index_add" in found[0].fix
