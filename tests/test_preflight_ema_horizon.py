"""EMA_DECAY_TOO_SLOW: an exponential moving average of the weights (a mean teacher, a
momentum encoder) whose decay leaves it mostly at its initialisation when the run ends,
measured wherever the update is written: in the model's forward, in the loss function on a
teacher the loss holds, in an optimizer step hook. A decay sized for the run, a frozen
teacher and BatchNorm's running statistics stay quiet; the check leaves every copy as it
found it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.ema_watch import EmaWatch
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.ema_horizon import EmaHorizonCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2))


class MeanTeacher(nn.Module):
    """The teacher is updated in the forward, before the optimizer's step (MoCo's order)."""

    def __init__(self, decay: float):
        super().__init__()
        torch.manual_seed(0)
        self.student = mlp()
        self.teacher = copy.deepcopy(self.student).requires_grad_(False)
        self.decay = decay

    def forward(self, x):
        with torch.no_grad():
            for t, s in zip(self.teacher.parameters(), self.student.parameters()):
                t.mul_(self.decay).add_(s.detach(), alpha=1 - self.decay)
        return self.student(x), self.teacher(x)


def consistency(model, batch):
    x, y = batch
    student, teacher = model(x)
    return F.cross_entropy(student, y) + F.mse_loss(student.softmax(1), teacher.softmax(1))


def issues(model, loss_fn, optimizer=None, max_steps=300) -> dict:
    optimizer = optimizer or torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 1e-3)
    report = run_preflight(model, optimizer, DataLoader(data(), batch_size=64, shuffle=True), loss_fn=loss_fn,
                           max_steps=max_steps, checks=[FirstBatchCheck(), FirstStepCheck(), EmaHorizonCheck()])
    return {i.code: i for i in report.check("step.ema_horizon").issues}


def test_a_decay_from_a_long_run_in_a_short_one_is_named_with_what_is_left():
    found = issues(MeanTeacher(0.9999), consistency)
    issue = found["EMA_DECAY_TOO_SLOW"]
    assert "decay 0.9999" in issue.message and "97% of its initialisation" in issue.message
    assert "teacher.0.weight" in issue.message and "1 - 10 / steps" in issue.fix


def test_a_decay_sized_for_the_run_stays_quiet():
    assert "EMA_DECAY_TOO_SLOW" not in issues(MeanTeacher(0.99), consistency)
    # the same decay is right for a run long enough to forget the start
    assert "EMA_DECAY_TOO_SLOW" not in issues(MeanTeacher(0.9999), consistency, max_steps=200_000)


@pytest.mark.parametrize("decay", [0.99, 0.9999])
def test_without_max_steps_the_run_is_judged_as_many_epochs(decay):
    """A plain loop that gives no max_steps trains for an unknown number of epochs: one epoch
    (8 batches here) is no measure of it. 0.99 is right for 20 epochs; 0.9999 is not."""
    found = issues(MeanTeacher(decay), consistency, max_steps=None)
    assert ("EMA_DECAY_TOO_SLOW" in found) == (decay == 0.9999)
    if found:
        assert "no max_steps given: 20 epochs assumed" in found["EMA_DECAY_TOO_SLOW"].message
        assert "trainer.max_steps" not in found["EMA_DECAY_TOO_SLOW"].fix


def test_a_momentum_encoder_held_by_the_loss_is_measured_and_restored():
    torch.manual_seed(0)
    student = mlp()
    key_encoder = copy.deepcopy(student).requires_grad_(False)
    start = copy.deepcopy(key_encoder.state_dict())

    def momentum_loss(model, batch):
        x, y = batch
        with torch.no_grad():
            for k, q in zip(key_encoder.parameters(), model.parameters()):
                k.mul_(0.999).add_(q.detach(), alpha=0.001)
            keys = key_encoder(x)
        logits = model(x)
        return F.cross_entropy(logits, y) + F.mse_loss(logits, keys)

    found = issues(student, momentum_loss)
    assert "key_encoder.0.weight" in found["EMA_DECAY_TOO_SLOW"].message
    for name, tensor in key_encoder.state_dict().items():
        assert torch.equal(tensor, start[name]), name


def test_an_update_in_an_optimizer_step_hook_is_seen():
    torch.manual_seed(0)
    model = mlp()
    averaged = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), 0.1)

    def update_average(*_):
        with torch.no_grad():
            for a, p in zip(averaged.parameters(), model.parameters()):
                a.lerp_(p, 1e-4)

    optimizer.register_step_post_hook(update_average)

    def loss(m, batch):
        x, y = batch
        return F.cross_entropy(m(x), y) + 0 * averaged(x).sum()

    assert "EMA_DECAY_TOO_SLOW" in issues(model, loss, optimizer)


@pytest.mark.parametrize("kind", ["frozen_teacher", "plain_model"])
def test_a_frozen_teacher_and_batchnorm_statistics_stay_quiet(kind):
    torch.manual_seed(0)
    student = mlp()
    teacher = mlp().requires_grad_(False)  # distillation from a fixed model

    def distill(model, batch):
        x, y = batch
        with torch.no_grad():
            target = teacher(x).softmax(1)
        return F.cross_entropy(model(x), y) + F.kl_div(model(x).log_softmax(1), target, reduction="batchmean")

    def plain(model, batch):
        return F.cross_entropy(model(batch[0]), batch[1])

    found = issues(student, distill if kind == "frozen_teacher" else plain)
    assert found == {}


def test_the_watch_fits_the_share_of_the_way_and_ignores_unrelated_changes():
    torch.manual_seed(0)
    trained = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(trained.parameters(), 0.1)
    holder = nn.Module()
    holder.ema = nn.Linear(4, 4).requires_grad_(False)
    holder.register_buffer("noise", torch.zeros(4, 4))
    watch = EmaWatch.of([("", holder)], optimizer)
    with watch.step(), torch.no_grad():
        holder.ema.weight.lerp_(trained.weight, 0.02)
        holder.noise.add_(torch.randn(4, 4))
    rate, names = watch.rate()
    assert rate == pytest.approx(0.02) and names == ["ema.weight"]
