"""MIX_LABEL_WEIGHTS: mixup / CutMix inside the loss function whose label weights do not
follow the mixed input (swapped mixup weights, CutMix's lam left as the box's area, a soft
target mixed the other way). Correct mixup, CutMix and soft-target mixing, and a loss that
permutes the batch for another purpose, stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.mix_labels import input_share
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.mix_labels import MixLabelsCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

CLASSES = 4


def images() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, CLASSES, (256,), generator=g)
    return TensorDataset(torch.randn(256, 3, 8, 8, generator=g) + y.view(-1, 1, 1, 1).float(), y)


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, CLASSES))


def lam_draws():
    beta = torch.distributions.Beta(torch.tensor(0.4), torch.tensor(0.4))
    return lambda: float(beta.sample())


def mixup(swapped: bool):
    draw = lam_draws()

    def loss_fn(model, batch):
        x, y = batch
        lam, perm = draw(), torch.randperm(x.size(0))
        out = model(lam * x + (1 - lam) * x[perm])
        if swapped:
            return (1 - lam) * F.cross_entropy(out, y) + lam * F.cross_entropy(out, y[perm])
        return lam * F.cross_entropy(out, y) + (1 - lam) * F.cross_entropy(out, y[perm])
    return loss_fn


def cutmix(lam_is_area: bool):
    draw = lam_draws()

    def loss_fn(model, batch):
        x, y = batch
        perm = torch.randperm(x.size(0))
        side = max(1, int(8 * (1 - draw()) ** 0.5))
        top, left = torch.randint(0, 9 - side, (2,)).tolist()
        mixed = x.clone()
        mixed[:, :, top:top + side, left:left + side] = x[perm][:, :, top:top + side, left:left + side]
        area = side * side / 64
        lam = area if lam_is_area else 1 - area
        out = model(mixed)
        return lam * F.cross_entropy(out, y) + (1 - lam) * F.cross_entropy(out, y[perm])
    return loss_fn


def soft_mixup(swapped: bool):
    draw = lam_draws()

    def loss_fn(model, batch):
        x, y = batch
        lam = draw()
        onehot = F.one_hot(y, CLASSES).float()
        target = (1 - lam) * onehot + lam * onehot.flip(0) if swapped else lam * onehot + (1 - lam) * onehot.flip(0)
        return F.cross_entropy(model(lam * x + (1 - lam) * x.flip(0)), target)
    return loss_fn


def issues(loss_fn) -> dict:
    model = cnn()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(images(), batch_size=32, shuffle=True), loss_fn=loss_fn, max_steps=300,
                           checks=[FirstBatchCheck(), FirstStepCheck(), MixLabelsCheck()])
    return {i.code: i for i in report.check("step.mix_labels").issues}


@pytest.mark.parametrize("loss_fn", [mixup(True), cutmix(True), soft_mixup(True)], ids=["mixup", "cutmix", "soft"])
def test_label_weights_that_do_not_follow_the_mixed_input_are_named(loss_fn):
    issue = issues(loss_fn)["MIX_LABEL_WEIGHTS"]
    assert "the two weights are swapped" in issue.message or "not the input's shares" in issue.message
    assert "lam * criterion(out, y)" in issue.fix and "1 - box_area" in issue.fix


@pytest.mark.parametrize("loss_fn", [mixup(False), cutmix(False), soft_mixup(False)], ids=["mixup", "cutmix", "soft"])
def test_label_weights_that_follow_the_mixed_input_stay_quiet(loss_fn):
    assert issues(loss_fn) == {}


def test_a_batch_permuted_for_negatives_is_not_mixing():
    def shuffled_negatives(model, batch):
        x, y = batch
        out = model(x)
        negative = model(x[torch.randperm(x.size(0))])
        return F.cross_entropy(out, y) + 0.1 * F.relu(1 - (out - negative).abs().mean())
    assert issues(shuffled_negatives) == {}


def test_the_input_share_reads_mixup_and_a_pasted_box():
    torch.manual_seed(0)
    x, partner = torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8)
    assert input_share(0.8 * x + 0.2 * partner, x, partner) == pytest.approx(0.8)
    boxed = x.clone()
    boxed[..., :4, :] = partner[..., :4, :]  # half the image pasted from the partner
    assert input_share(boxed, x, partner) == pytest.approx(0.5, abs=0.01)
    assert input_share(x + torch.randn_like(x), x, partner) is None  # not built from the two
