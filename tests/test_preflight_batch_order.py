"""LOSS_ORDER_DEPENDENT: a loss over a shuffled batch that changes with the order of its samples."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.batch_order import BatchOrderCheck, permuted_batch
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def survival_rows(rows: int = 1024):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 6, generator=g)
    time = torch.distributions.Exponential(torch.exp(x[:, 0])).sample() + 0.01
    event = (torch.rand(rows, generator=g) > 0.3).float()
    return TensorDataset(x, time, event)


def cox_loss(sort_inside: bool):
    def loss_fn(model, batch):
        x, time, event = batch
        risk = model(x).squeeze(-1)
        if sort_inside:
            order = torch.argsort(time, descending=True)
            risk, event = risk[order], event[order]
        return -((risk - torch.logcumsumexp(risk, 0)) * event).sum() / event.sum().clamp_min(1.0)
    return loss_fn


def order_issues(loss_fn, shuffle: bool = True, data=None, model=None):
    model = model or nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(data or survival_rows(), batch_size=128, shuffle=shuffle),
                           loss_fn=loss_fn, checks=[FirstBatchCheck(), FirstStepCheck(), BatchOrderCheck()])
    result = report.check("step.batch_order")
    assert result.status.value != "crashed", result.detail
    return [i for i in result.issues if i.code == "LOSS_ORDER_DEPENDENT"], result


@pytest.mark.parametrize("sort_inside, shuffle, fires", [(False, True, True), (True, True, False), (False, False, False)],
                         ids=["unsorted_risk_sets", "sorted_in_the_loss", "presorted_loader_without_shuffle"])
def test_a_cox_loss_over_unsorted_risk_sets(sort_inside, shuffle, fires):
    issues, result = order_issues(cox_loss(sort_inside), shuffle=shuffle)
    assert bool(issues) == fires, result.data
    if issues:
        assert "torch.logcumsumexp along dim 0" in issues[0].message and "argsort(time" in issues[0].fix


def test_a_cox_loss_that_sorts_tied_monthly_times_itself_is_quiet():
    rows = survival_rows()
    x, time, event = rows.tensors
    # Many subjects share a year: the sort leaves ties. (Quarters left so few that on some first batches the
    # reordering moved the loss by less than the check's threshold, and the tied-keys path was not reached.)
    yearly = TensorDataset(x, time.ceil(), event)
    issues, result = order_issues(cox_loss(sort_inside=True), data=yearly)
    assert issues == [] and "tied keys" in result.data["summary"]


def pairs_by_position(model, batch):
    x, _ = batch
    z = F.normalize(model(x), dim=1)
    return (1 - (z[0::2] * z[1::2]).sum(1)).mean()  # "x[2i] and x[2i+1] are two views": not after a shuffle


def in_batch_softmax(model, batch):
    x, y = batch
    u, v = F.normalize(model(x), dim=1), F.normalize(model(y), dim=1)
    return F.cross_entropy(u @ v.T / 0.1, torch.arange(len(x)))


def noisy_denoiser(model, batch):
    x, _ = batch
    return F.mse_loss(model(x + 0.3 * torch.randn_like(x)), model(x).detach())


@pytest.mark.parametrize("loss_fn, fires", [(pairs_by_position, True), (in_batch_softmax, False),
                                            (noisy_denoiser, False)],
                         ids=["pairs_by_position", "in_batch_softmax", "random_noise_in_the_loss"])
def test_pairs_by_position_fire_and_order_free_losses_stay_quiet(loss_fn, fires):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 6, generator=g)
    data = TensorDataset(x, x + 0.1 * torch.randn(512, 6, generator=g))
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 6))
    issues, result = order_issues(loss_fn, data=data, model=model)
    assert bool(issues) == fires, result.data


def test_a_batch_with_a_tensor_that_is_not_per_sample_is_left_alone():
    x, adjacency = torch.randn(16, 4), torch.rand(16, 16)
    assert permuted_batch((x, adjacency), torch.randperm(16)) is None
    assert permuted_batch((x, torch.arange(40)), torch.randperm(16)) is None  # concatenated targets
    moved = permuted_batch({"x": x, "y": torch.arange(16)}, torch.arange(16).flip(0))
    assert torch.equal(moved["y"], torch.arange(16).flip(0)) and torch.equal(moved["x"], x.flip(0))


def test_a_list_of_batches_keeps_its_order():
    from optimus_preflight.preflight.checks.batch_order import draws_at_random

    assert not draws_at_random([(torch.zeros(2), torch.zeros(2))])
    assert draws_at_random(DataLoader(survival_rows(), shuffle=True))
    assert not draws_at_random(DataLoader(survival_rows()))


def test_a_nan_loss_is_no_order_dependence():
    # NaN differs from itself: a loss that is NaN in every order says nothing about the order. NaN
    # in the no-grad forwards only (a padding mask that masks a whole row in eval), so the
    # training step before them stays finite
    def nan_loss(model, batch):
        loss = model(batch[0]).pow(2).mean()
        return loss if torch.is_grad_enabled() else loss * float("nan")

    issues, result = order_issues(nan_loss)
    assert not issues and result.data["summary"] == "no finite scalar loss"


def smoothed_targets(dim: int):
    """Hand-written label smoothing: the target's mass put with scatter_ along ``dim``."""
    def loss_fn(model, batch):
        x, y = batch
        logits = model(x)
        target = torch.full_like(logits, 0.1 / logits.shape[1]).scatter_(dim, y.unsqueeze(1), 0.9 + 0.1 / logits.shape[1])
        return -(target * F.log_softmax(logits, dim=1)).sum(1).mean()
    return loss_fn


@pytest.mark.parametrize("dim, fires", [(0, True), (1, False)], ids=["scatter_along_batch", "scatter_along_classes"])
def test_label_smoothing_scattered_along_the_batch_depends_on_the_order(dim, fires):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 6, generator=g), torch.randint(0, 4, (512,), generator=g))
    torch.manual_seed(0)
    found, _ = order_issues(smoothed_targets(dim), data=data, model=nn.Linear(6, 4))
    assert bool(found) == fires
    if fires:
        assert "scatter_(0, y.unsqueeze(1), value)" in found[0].message and "scatter_(1," in found[0].fix
