"""UPDATE_TOO_SMALL: a learning rate so small that the whole run could not move the weights
by 0.5% (the first update, scaled by the schedule's summed lr); healthy rates, short runs
and a warmup from almost zero stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.checks.update_checks import UpdateCheck, run_lr_multiple


def issues(optimizer_of, max_steps: int, scheduler_of=None) -> list:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = optimizer_of(model.parameters())
    x, y = torch.randn(512, 16), torch.randint(0, 4, (512,))
    report = run_preflight(model, optimizer, DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), max_steps=max_steps,
                           scheduler=scheduler_of(optimizer) if scheduler_of else None,
                           checks=[FirstBatchCheck(), FirstStepCheck(), UpdateCheck()])
    return [i for i in report.check("step.update").issues if i.code == "UPDATE_TOO_SMALL"]


@pytest.mark.parametrize("optimizer_of", [lambda p: torch.optim.Adam(p, lr=1e-7), lambda p: torch.optim.SGD(p, lr=1e-7)],
                         ids=["adam_1e-7", "sgd_1e-7"])
def test_a_rate_that_cannot_move_the_weights_in_the_whole_run_fires(optimizer_of):
    found = issues(optimizer_of, 2000)
    assert found and "Raise the learning rate" in found[0].fix


def test_an_exponential_decay_stepped_per_batch_fires():
    found = issues(lambda p: torch.optim.Adam(p, lr=1e-4), 3000,
                   lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.5))
    assert found


@pytest.mark.parametrize("optimizer_of, max_steps, scheduler_of", [
    (lambda p: torch.optim.Adam(p, lr=1e-3), 2000, None),
    (lambda p: torch.optim.Adam(p, lr=1e-4), 20, None),
    (lambda p: torch.optim.Adam(p, lr=1e-3), 2000, lambda o: torch.optim.lr_scheduler.LinearLR(o, 1e-6, 1.0, 100)),
], ids=["adam_1e-3", "short_run", "warmup_from_1e-6"])
def test_healthy_rates_stay_quiet(optimizer_of, max_steps, scheduler_of):
    assert not issues(optimizer_of, max_steps, scheduler_of)


def test_the_summed_schedule_is_in_units_of_the_first_step():
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    assert run_lr_multiple(None, optimizer, 100) == 100.0
    halving = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)
    assert run_lr_multiple(halving, optimizer, 100) == pytest.approx(2.0, rel=1e-6)


def test_radam_whose_first_steps_are_a_rectified_warmup_is_not_judged():
    assert not issues(lambda p: torch.optim.RAdam(p, lr=1e-3, weight_decay=0.01, decoupled_weight_decay=True), 2000)


def _finished_run_state(final_lr: float) -> dict:
    """The optimizer state of a finished run whose cosine schedule ended at final_lr."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=20, eta_min=final_lr)
    for _ in range(20):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(32, 16)), torch.randint(0, 4, (32,))).backward()
        optimizer.step()
        schedule.step()
    return optimizer.state_dict()


@pytest.mark.parametrize("final_lr, restored", [(1e-7, True), (5e-4, False)])
def test_an_optimizer_state_loaded_from_a_finished_run_names_the_restored_lr(final_lr, restored):
    saved = _finished_run_state(final_lr)

    def resumed(params):
        optimizer = torch.optim.Adam(params, lr=1e-3)
        optimizer.load_state_dict(saved)  # "resume everything from the checkpoint"
        return optimizer

    found = issues(resumed, 2000)
    if not restored:  # the state of a run that kept a useful lr: nothing to say
        assert found == []
        return
    assert len(found) == 1
    assert "built with lr=0.001 and already held state" in found[0].message
    assert "optimizer.load_state_dict(checkpoint['optimizer'])" in found[0].fix
