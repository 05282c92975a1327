"""Fires / stays-quiet pairs for mechanics read from the step and the loader:
LOSS_MULTIPLIED (a static loss scale left in compute_loss), TARGET_ZERO_ONE_SIGN (0/1
targets to a +1/-1 criterion), O8 for a schedule that only rises, BN_SMALL_BATCH, and
DATASET_MUTATED (a __getitem__ that rewrites the stored table; quiet for a scratch buffer
each read overwrites)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.batch_checks import FinalBatchCheck
from optimus_preflight.preflight.checks.config_checks import LrScheduleCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.dataset_mutation import DatasetMutationCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, TargetsCheck
from optimus_preflight.preflight.checks.step_runs import LossScaleCheck

g = torch.Generator().manual_seed(0)
X, Y = torch.randn(512, 8, generator=g), torch.randint(0, 3, (512,), generator=g)


def codes(model, loss_fn, checks, loader=None, **kwargs) -> set[str]:
    loader = loader or DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True)
    report = run_preflight(model, kwargs.pop("optimizer", None) or torch.optim.SGD(model.parameters(), lr=0.05),
                           loader, loss_fn=loss_fn, checks=[FirstBatchCheck(), *checks], **kwargs)
    return {issue.code for check in report.checks for issue in check.issues if issue.severity.value != "info"}


@pytest.mark.parametrize("factor, fires", [(128.0, True), (1.0, False), (0.5, False), (3.0, False)])
def test_a_power_of_two_static_loss_scale(factor, fires):
    loss = lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]) * factor  # noqa: E731
    assert ("LOSS_MULTIPLIED" in codes(nn.Linear(8, 3), loss, [FirstStepCheck(), LossScaleCheck()])) == fires


@pytest.mark.parametrize("to_sign, fires", [(False, True), (True, False)])
def test_zero_one_targets_to_cosine_embedding_loss(to_sign, fires):
    def loss(model, batch):
        x, y = batch
        same = (y == 0).float()
        return nn.functional.cosine_embedding_loss(model(x), model(x.flip(0)), same * 2 - 1 if to_sign else same)
    assert ("TARGET_ZERO_ONE_SIGN" in codes(nn.Linear(8, 4), loss, [FirstStepCheck(), TargetsCheck()])) == fires


@pytest.mark.parametrize("ramp, fires", [(lambda s: 10 ** (s / 60), True), (lambda s: min(1.0, (s + 1) / 100), False)],
                         ids=["range_test_ramp", "warmup"])
def test_a_schedule_that_only_rises(ramp, fires):
    model = nn.Linear(8, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-5)
    found = codes(model, nn.CrossEntropyLoss(), [LrScheduleCheck()], optimizer=optimizer,
                  scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, ramp), max_steps=2000)
    assert ("O8" in found) == fires


def test_a_warmup_longer_than_the_run_is_not_called_a_range_test():
    model = nn.Linear(8, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4000))
    report = run_preflight(model, optimizer, DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), scheduler=warmup, max_steps=300,
                           checks=[FirstBatchCheck(), LrScheduleCheck()])
    messages = [i.message for i in report.check("config.lr_schedule").issues if i.code == "O8"]
    assert messages and all("range test" not in m for m in messages) and any("all warmup" in m for m in messages)
    assert any("longer than the run" in m and "about 4000 steps" in m for m in messages)


@pytest.mark.parametrize("schedule, severity", [
    (lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2000), "info"),  # full rate, no annealing
    (lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=5000), "warning"),  # in warmup
], ids=["cosine_cut_short", "one_cycle_still_warming_up"])
def test_a_schedule_longer_than_the_run(schedule, severity):
    model = nn.Linear(8, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    report = run_preflight(model, optimizer, DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), scheduler=schedule(optimizer), max_steps=300,
                           checks=[FirstBatchCheck(), LrScheduleCheck()])
    found = [i for i in report.check("config.lr_schedule").issues if "decay never happens" in i.message]
    assert [i.severity.value for i in found] == [severity]


def test_noam_over_a_base_lr_of_one_is_its_own_schedule():
    # The lambda returns the learning rate (d_model ** -0.5 * min(...)) over Adam(lr=1.0): its
    # warmup outlasting a short run is a choice, and lr=1.0 is not a value it should reach.
    model = nn.Linear(8, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0)
    noam = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 64 ** -0.5 * min((s + 1) ** -0.5, (s + 1) * 400 ** -1.5))
    assert "O8" not in codes(model, nn.CrossEntropyLoss(), [LrScheduleCheck()], optimizer=optimizer, scheduler=noam,
                             max_steps=300)


@pytest.mark.parametrize("batch_size, fires", [(2, True), (32, False)])
def test_batchnorm_on_micro_batches_of_two(batch_size, fires):
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    loader = DataLoader(TensorDataset(X, Y), batch_size=batch_size, shuffle=True, drop_last=True)
    assert ("BN_SMALL_BATCH" in codes(model, nn.CrossEntropyLoss(), [FinalBatchCheck()], loader=loader)) == fires


@pytest.mark.parametrize("batch_size, fires", [(1, True), (16, False)])
def test_batchnorm_over_a_sequence_with_one_sample_per_batch(batch_size, fires):
    # (1, C, L): BatchNorm1d runs, normalising the one clip by itself (an InstanceNorm)
    model = nn.Sequential(nn.Conv1d(1, 8, 5, padding=2), nn.BatchNorm1d(8), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
                          nn.Flatten(), nn.Linear(8, 3))
    loader = DataLoader(TensorDataset(torch.randn(64, 1, 32), torch.randint(0, 3, (64,))), batch_size=batch_size,
                        shuffle=True)
    found = codes(model, nn.CrossEntropyLoss(), [FinalBatchCheck()], loader=loader)
    assert ("BN_SMALL_BATCH" in found) == fires


class Meters(Dataset):
    def __init__(self, in_place: bool):
        self.x, self.y, self.in_place = X.clone(), Y.clone(), in_place
        self.mean, self.std = self.x.mean(0), self.x.std(0)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i]
        x = x.sub_(self.mean).div_(self.std) if self.in_place else (x - self.mean) / self.std
        return x, self.y[i]


@pytest.mark.parametrize("in_place, fires", [(True, True), (False, False)])
def test_a_getitem_that_rewrites_the_table(in_place, fires):
    loader = DataLoader(Meters(in_place), batch_size=32, shuffle=True)
    assert ("DATASET_MUTATED" in codes(nn.Linear(8, 3), nn.CrossEntropyLoss(), [DatasetMutationCheck()],
                                       loader=loader)) == fires


class Windows(Dataset):
    """Each read fills a preallocated scratch buffer, normalises it in place and returns a
    clone: the buffer changes on every read, but the same index always reads the same
    sample. ``noise``: plus a random augmentation drawn from the global generator.
    ``running``: normalised by a running mean that every read updates (the same index
    reads other values later: the harm)."""

    def __init__(self, noise: bool = False, running: bool = False, as_buffer: bool = False):
        self.signals, self.labels = X.clone(), Y.clone()
        self._buf = torch.empty(self.signals.shape[1])
        self.running_mean = torch.zeros(self.signals.shape[1])
        self.noise, self.running, self.as_buffer = noise, running, as_buffer

    def __len__(self):
        return len(self.signals)

    def __getitem__(self, i):
        self._buf.copy_(self.signals[i])
        if self.running:
            self.running_mean.mul_(0.9).add_(0.1 * self._buf)
            self._buf.sub_(self.running_mean)
        else:
            self._buf.sub_(self._buf.mean())
        if self.noise:
            self._buf.add_(0.01 * torch.randn(self._buf.shape))
        return (self._buf if self.as_buffer else self._buf.clone()), self.labels[i]


@pytest.mark.parametrize("options, fires", [
    ({}, False), ({"noise": True}, False), ({"running": True}, True), ({"as_buffer": True}, True)],
    ids=["scratch_buffer", "scratch_buffer_random_augmentation", "running_mean_every_read", "returns_the_buffer"])
def test_a_scratch_buffer_each_read_overwrites(options, fires):
    loader = DataLoader(Windows(**options), batch_size=32, shuffle=True)
    assert ("DATASET_MUTATED" in codes(nn.Linear(8, 3), nn.CrossEntropyLoss(), [DatasetMutationCheck()],
                                       loader=loader)) == fires


def test_zero_one_targets_are_named_with_the_module_a_user_builds():
    criterion = nn.MarginRankingLoss(margin=0.1)

    def loss(model, batch):
        x, y = batch
        return criterion(model(x).squeeze(1), model(x.flip(0)).squeeze(1), (y == 0).float())

    model = nn.Linear(8, 1)
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.05),
                           DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True), loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    issue = next(i for _, i in report.issues() if i.code == "TARGET_ZERO_ONE_SIGN")
    assert "margin_ranking_loss (nn.MarginRankingLoss) gets 0/1 targets" in issue.message
    assert "before nn.MarginRankingLoss" in issue.fix
