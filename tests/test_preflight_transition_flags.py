"""step.transition_flags: a TD loss that ignores the done flags of its transitions
(DONE_FLAGS_UNUSED), in (s, r, s', done) tuples and {'obs', ..., 'done'} mappings; a TD
target masked with (1 - done), and batches that are not transitions, stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.transition_flags import TransitionFlagsCheck, flag_field
from tests.preflight_support import assert_quiet


def chain(n: int = 2000):
    g = torch.Generator().manual_seed(0)
    state = torch.randint(1, 10, (n,), generator=g)
    following = state + torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
    reward, done = (following == 10).float(), ((following == 0) | (following == 10)).float()
    return (state.float() / 10)[:, None], reward, (following.float() / 10)[:, None], done


def td(masked: bool):
    def loss(model, batch):
        s, r, s2, done = (batch["obs"], batch["reward"], batch["next_obs"], batch["done"]) if isinstance(batch, dict) \
            else batch
        with torch.no_grad():
            bootstrap = model(s2).squeeze(-1)
        target = r + 0.9 * ((1 - done) * bootstrap if masked else bootstrap)
        return F.mse_loss(model(s).squeeze(-1), target)
    return loss


def run(masked: bool, as_dict: bool = False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    fields = chain()
    data = TensorDataset(*fields)
    collate = None
    if as_dict:
        def collate(rows):
            s, r, s2, d = (torch.stack(column) for column in zip(*rows))
            return {"obs": s, "reward": r, "next_obs": s2, "done": d}
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(data, batch_size=64, shuffle=True, collate_fn=collate), loss_fn=td(masked),
                           checks=[FirstBatchCheck(), TransitionFlagsCheck()])
    return report.check("step.transition_flags")


@pytest.mark.parametrize("as_dict", [False, True], ids=["tuple", "mapping"])
def test_a_td_target_that_ignores_the_done_flags_fires(as_dict):
    result = run(masked=False, as_dict=as_dict)
    issues = [i for i in result.issues if i.code == "DONE_FLAGS_UNUSED"]
    assert issues, result.data
    assert "(1 - done)" in issues[0].fix


def test_a_masked_td_target_stays_quiet():
    result = run(masked=True)
    assert_quiet(result)
    assert result.data["loss"] != result.data["loss_flags_flipped"]


def test_only_transition_batches_have_a_flag_field():
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,)).float()
    assert flag_field((x, y)) is None  # binary labels of a plain (x, y) batch
    assert flag_field((x, torch.randn(8), torch.randn(8, 4), y)) is None  # no (state, next state) pair
    s, r, s2, done = chain(64)
    assert flag_field((s, r, s2, done)) == 3


def test_the_repeated_states_of_a_small_environment_are_not_identical_samples():
    # a 4-state corridor: 64 transitions hold 4 distinct states, with different rewards and next
    # states; DATA_IDENTICAL's "same input, different targets" does not apply to transitions
    from optimus_preflight.preflight.checks.data_checks import DuplicateSamplesCheck

    g = torch.Generator().manual_seed(0)
    state = torch.randint(1, 5, (2000,), generator=g)
    following = state + torch.where(torch.rand(2000, generator=g) < 0.5, -1, 1)
    reward, done = (following == 5).float(), ((following == 0) | (following == 5)).float()
    corridor = TensorDataset((state.float() / 5)[:, None], reward, (following.float() / 5)[:, None], done)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(corridor, batch_size=64, shuffle=True), loss_fn=td(True),
                           checks=[FirstBatchCheck(), DuplicateSamplesCheck()])
    assert not [i.code for i in report.check("data.duplicates").issues if i.severity.value != "info"]
