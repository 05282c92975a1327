"""Non-finite gradients: the step is skipped, counted, and the scheduler holds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optimus_preflight.errors import TrainingDiverged
from optimus_preflight.training.optim import constant, warmup_cosine
from optimus_preflight.training.run_state import RunState
from tests.step_helpers import make_runner, mean_squared_error, window


class PoisonOnCall:
    """A loss that turns inf on chosen calls, as a bad batch or an overflow would."""

    def __init__(self, poisoned_calls):
        self.poisoned_calls = set(poisoned_calls)
        self.calls = 0

    def __call__(self, model, batch):
        self.calls += 1
        loss = mean_squared_error(model, batch)
        return loss * float("inf") if self.calls in self.poisoned_calls else loss


def _batch():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(4, 3, generator=generator), torch.randn(4, 2, generator=generator)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_inf_gradient_skips_step_and_holds_scheduler(precision):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = warmup_cosine(optimizer, warmup_steps=2, min_lr_ratio=0.1, total_steps=10)
    loss_fn = PoisonOnCall({2})
    runner, _ = make_runner(model, loss_fn, precision=precision, optimizer=optimizer, scheduler=scheduler)
    state = RunState()

    first = runner.run(window([_batch()]))
    state.record_step(first.stepped, first.samples)
    lr_before, epoch_before = optimizer.param_groups[0]["lr"], scheduler.last_epoch
    weights_before = [p.detach().clone() for p in model.parameters()]

    second = runner.run(window([_batch()]))
    state.record_step(second.stepped, second.samples)

    assert first.stepped and not second.stepped
    assert not torch.isfinite(second.grad_norm)
    assert state.skipped_steps == 1 and state.consecutive_skips == 1 and state.step == 2
    assert scheduler.last_epoch == epoch_before
    assert optimizer.param_groups[0]["lr"] == lr_before
    for before, after in zip(weights_before, model.parameters()):
        assert torch.equal(before, after.detach())
    assert all(p.grad is None for p in model.parameters())

    third = runner.run(window([_batch()]))
    state.record_step(third.stepped, third.samples)
    assert third.stepped and state.consecutive_skips == 0 and scheduler.last_epoch == epoch_before + 1


def test_fp16_skip_backs_off_the_grad_scale():
    model = nn.Linear(3, 2)
    runner, _ = make_runner(model, PoisonOnCall({1}), precision="fp16")
    scale = runner.scaler.get_scale()
    result = runner.run(window([_batch()]))
    assert not result.stepped
    assert runner.scaler.get_scale() == scale * 0.5


def test_skip_nonfinite_false_applies_the_step():
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    runner, _ = make_runner(model, PoisonOnCall({1}), optimizer=optimizer, skip_nonfinite=False)
    result = runner.run(window([_batch()]))
    assert result.stepped
    assert not torch.isfinite(model.weight).all()


def test_consecutive_skips_stop_the_run_with_a_diagnosis():
    state = RunState()
    for _ in range(3):
        state.record_step(stepped=False, samples=4)
    state.check_divergence(limit=4, precision="fp16", last_loss=float("inf"))  # under the limit
    state.record_step(stepped=False, samples=4)
    with pytest.raises(TrainingDiverged) as error:
        state.check_divergence(limit=4, precision="fp16", last_loss=float("inf"))
    message = str(error.value)
    assert "trainer.max_consecutive_skips" in message and "bf16" in message


def test_constant_schedule_warms_up_linearly():
    optimizer = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
    scheduler = constant(optimizer, warmup_steps=4)
    lrs = []
    for _ in range(6):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
