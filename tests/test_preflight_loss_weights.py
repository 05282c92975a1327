"""LOSS_WEIGHTS_AFTER_MEAN (``analyses/loss_weights.py``, reported by ``step.loss_function``):
per-sample weights multiplied into a criterion's output that is already the batch's mean,
``(criterion(out, y) * w).mean()``, which is the batch loss times ``w.mean()``. Each is
written the way a user writes the bug, next to its correct twin (``reduction='none'`` then
weighting) and a scalar weight times the mean loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.loss_weights import WeightsAfterMeanWatch
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck

CODE = "LOSS_WEIGHTS_AFTER_MEAN"


def _issues(model, loader, loss_fn):
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    step = report.check("step.first_step")
    assert not [i for i in step.issues if i.code in ("STEP_ERROR", "O3")], step.issues
    return [i for i in report.check("step.loss_function").issues if i.code == CODE]


def _weighted_classes():
    """(x, label, sample weight): a quarter of the samples weighted 0 (noisy labels dropped)."""
    torch.manual_seed(0)
    n = 256
    weights = torch.rand(n) + 0.5
    weights[::4] = 0.0
    return DataLoader(TensorDataset(torch.randn(n, 8), torch.randint(0, 5, (n,)), weights), batch_size=32)


def _weighted_regression():
    torch.manual_seed(0)
    n = 256
    return DataLoader(TensorDataset(torch.randn(n, 6), torch.randn(n), torch.rand(n)), batch_size=32)


def _classifier():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 5))


def test_mean_cross_entropy_times_sample_weights_is_an_error():
    criterion = nn.CrossEntropyLoss()  # reduction='mean'

    def loss_fn(model, batch):
        x, y, w = batch
        loss = criterion(model(x), y)
        return (loss * w).mean()  # = loss * w.mean(): no sample is weighted

    torch.manual_seed(0)
    issues = _issues(_classifier(), _weighted_classes(), loss_fn)
    assert len(issues) == 1 and issues[0].severity.value == "error"
    message = issues[0].message
    assert "reduction='mean'" in message and "(32,)" in message and "w.mean()" in message
    assert "weight 0" in message  # the zero-weighted samples are named
    assert "reduction='none'" in issues[0].fix and "(losses * w).sum() / w.sum()" in issues[0].fix
    assert "nn.CrossEntropyLoss(reduction='none')" in issues[0].fix


def test_weights_first_then_a_normalised_sum_of_a_functional_mse_is_an_error_too():
    def loss_fn(model, batch):
        x, y, w = batch
        pred = model(x).squeeze(-1)
        return (w * F.mse_loss(pred, y)).sum() / w.sum()

    torch.manual_seed(0)
    issues = _issues(nn.Linear(6, 1), _weighted_regression(), loss_fn)
    assert len(issues) == 1 and "mse_loss" in issues[0].message and "w.sum()" in issues[0].message


def test_a_scaled_mean_loss_times_weights_is_followed():
    criterion = nn.CrossEntropyLoss()

    def loss_fn(model, batch):
        x, y, w = batch
        return (0.5 * criterion(model(x), y) * w).mean()

    torch.manual_seed(0)
    assert len(_issues(_classifier(), _weighted_classes(), loss_fn)) == 1


QUIET = {
    "reduction_none_then_weighted": lambda out, y, w: (
        (nn.CrossEntropyLoss(reduction="none")(out, y) * w).sum() / w.sum()),
    "functional_none_weighted_mean": lambda out, y, w: (F.cross_entropy(out, y, reduction="none") * w).mean(),
    "scalar_weight_times_mean": lambda out, y, w: 0.5 * F.cross_entropy(out, y),
    "tensor_scalar_times_mean": lambda out, y, w: torch.tensor(2.0) * nn.CrossEntropyLoss()(out, y),
    "mean_plus_weighted_term": lambda out, y, w: F.cross_entropy(out, y) + 0.01 * (w * out.pow(2).mean(1)).mean(),
}


@pytest.mark.parametrize("setup", sorted(QUIET))
def test_per_sample_losses_weighted_and_scalar_weights_stay_quiet(setup):
    def loss_fn(model, batch):
        x, y, w = batch
        return QUIET[setup](model(x), y, w)

    torch.manual_seed(0)
    assert _issues(_classifier(), _weighted_classes(), loss_fn) == []


def test_the_watch_needs_the_reduction_of_the_weighted_product():
    watch = WeightsAfterMeanWatch()
    watch.start(4)
    loss = F.mse_loss(torch.randn(4), torch.randn(4))
    watch.observe("mse_loss", (torch.randn(4), torch.randn(4)), {"reduction": "mean"}, loss)
    w = torch.tensor([0.0, 1.0, 2.0, 1.0])
    product = loss * w
    watch.observe("mul", (loss, w), {}, product)
    assert watch.found is None  # not reduced yet
    watch.observe("mul", (loss, torch.ones(3)), {}, loss * torch.ones(3))  # not the batch's size
    normalised = product / w.sum()
    watch.observe("div", (product, w.sum()), {}, normalised)
    watch.observe("sum", (normalised,), {}, normalised.sum())
    found = watch.found
    assert found is not None and (found.criterion, found.reduced_by, found.zero_weights) == ("mse_loss", "sum", 1)
