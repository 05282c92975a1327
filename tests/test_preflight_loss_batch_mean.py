"""LOSS_ONLY_BATCH_MEAN: a regression loss that squares the batch's mean error, (pred - y).mean()
** 2, gives every sample the same gradient and fires; the mean of squared errors, an L1 loss, a
cross-entropy and a loss of no gradient stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.loss_batch_mean import LossBatchMeanCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def regression(loss_fn, classes: int = 0):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 6, generator=g)
    y = x[:, 0] * 2 + 1 if not classes else x[:, :classes].argmax(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, classes or 1), *([] if classes else [nn.Flatten(0)]))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossBatchMeanCheck()])
    result = report.check("step.loss_batch_mean")
    assert result.status.value != "crashed", result.detail
    return [i for i in result.issues if i.code == "LOSS_ONLY_BATCH_MEAN"]


@pytest.mark.parametrize("loss_fn, fires", [
    (lambda model, batch: (model(batch[0]) - batch[1]).mean() ** 2, True),
    (lambda model, batch: (model(batch[0]).sum() - batch[1].sum()).abs(), True),
    (lambda model, batch: ((model(batch[0]) - batch[1]) ** 2).mean(), False),
    (lambda model, batch: F.l1_loss(model(batch[0]), batch[1]), False),
    (lambda model, batch: model(batch[0]).sum() * 0.0, False),
], ids=["square_of_mean_error", "sum_difference", "mean_squared_error", "l1", "no_gradient"])
def test_a_loss_of_the_batch_mean_error(loss_fn, fires):
    found = regression(loss_fn)
    assert bool(found) == fires
    if fires:
        assert "same gradient" in found[0].message and "F.mse_loss(pred, y)" in found[0].fix


def test_a_classifier_is_quiet():
    assert not regression(nn.CrossEntropyLoss(), classes=3)


def test_an_l1_loss_whose_errors_all_share_a_sign_at_init_is_quiet():
    # targets far above the fresh head's outputs: every error is negative, so Smooth L1 (beta small)
    # gives every row the same gradient, -1/N, at the model's output, but not once the signs mix
    def far_targets(model, batch):
        return nn.SmoothL1Loss(beta=0.05)(model(batch[0]), batch[1] + 10.0)

    assert not regression(far_targets)
