"""data.row_shift: NEXT_ROWS_BACKWARD, logged transitions whose next observations were built with
torch.roll(obs, 1, 0), the previous row; the forward shift and unrelated fields stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.row_shift import RowShiftCheck, shifted_back


def transitions(shift: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(600, 4, generator=g).cumsum(0)  # one logged trajectory
    actions, rewards = torch.randint(0, 3, (600,), generator=g), torch.randn(600, generator=g)
    next_obs = torch.roll(obs, shift, 0) if shift else torch.randn(600, 4, generator=g)
    return TensorDataset(obs, actions, rewards, next_obs)


def td_loss(model, batch):
    obs, actions, rewards, next_obs = batch
    q = model(obs).gather(1, actions[:, None]).squeeze(1)
    return nn.functional.mse_loss(q, rewards + 0.9 * model(next_obs).max(1).values.detach())


@pytest.mark.parametrize("shift", [1, -1, 0], ids=["previous_row", "next_row", "unrelated"])
def test_next_observations_rolled_the_wrong_way(shift):
    model = nn.Linear(4, 3)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(transitions(shift), batch_size=64, shuffle=True), loss_fn=td_loss,
                           checks=[FirstBatchCheck(), RowShiftCheck()])
    found = [i for i in report.check("data.row_shift").issues if i.code == "NEXT_ROWS_BACKWARD"]
    assert bool(found) == (shift == 1)
    if found:
        assert "batch[3] of row k equals batch[0] of row k - 1" in found[0].message and "roll(obs, -1" in found[0].fix


def test_a_field_equal_to_its_own_row_is_no_shift():
    rows = torch.ones(64, 2)
    assert shifted_back(rows, rows.clone()) is None
