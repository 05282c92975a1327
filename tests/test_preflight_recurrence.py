"""DETACHED_RECURRENCE: a hand-unrolled GRUCell loop that detaches its state at every step;
full backpropagation through time, and a state detached once per batch, stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.recurrence import RecurrenceCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


class Sessions(nn.Module):
    def __init__(self, detach_each_step: bool, carried: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.detach_each_step, self.carried = detach_each_step, carried
        self.embed, self.cell, self.head = nn.Embedding(20, 16), nn.GRUCell(16, 16), nn.Linear(16, 3)
        self.state = None

    def forward(self, ids):
        e = self.embed(ids)
        h = self.state.detach() if self.carried and self.state is not None else e.new_zeros(ids.shape[0], 16)
        for t in range(ids.shape[1]):
            h = self.cell(e[:, t], h.detach() if self.detach_each_step else h)
        self.state = h
        return self.head(h)


@pytest.mark.parametrize("detach_each_step, carried, fires", [(True, False, True), (False, False, False),
                                                              (False, True, False)],
                         ids=["detached_every_step", "full_bptt", "detached_between_batches"])
def test_a_state_detached_at_every_step(detach_each_step, carried, fires):
    ids, y = torch.randint(0, 20, (256, 12)), torch.randint(0, 3, (256,))
    model = Sessions(detach_each_step, carried)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids, y), batch_size=32, shuffle=True, drop_last=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), RecurrenceCheck()])
    issues = report.check("step.recurrence").issues
    assert bool(issues) == fires
