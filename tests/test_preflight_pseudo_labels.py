"""TARGETS_FROM_UNTRAINED_MODEL: pseudo-labels computed once from the model before it was
trained, served by the DataLoader. Pseudo-labels the loss computes from the current model
(online self-training), true labels, and a trained model that agrees with its labels stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, TargetsCheck

CLASSES = 4


def blobs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    means = torch.randn(CLASSES, 10, generator=g) * 2
    y = torch.randint(0, CLASSES, (1024,), generator=g)
    return means[y] + torch.randn(1024, 10, generator=g), y


def classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def findings(model, dataset, loss_fn) -> dict:
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(dataset, batch_size=64, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    return {i.code: i for i in report.check("step.targets").issues}


def labelled_plus_pseudo(model, batch):
    x_labelled, y, x_unlabelled, pseudo = batch
    return F.cross_entropy(model(x_labelled), y) + F.cross_entropy(model(x_unlabelled), pseudo)


def test_pseudo_labels_from_the_model_before_training_are_named():
    x, y = blobs()
    model = classifier()
    with torch.no_grad():
        pseudo = model(x[512:]).argmax(1)  # before any step: the model's random guesses
    found = findings(model, TensorDataset(x[:512], y[:512], x[512:], pseudo), labelled_plus_pseudo)
    issue = found["TARGETS_FROM_UNTRAINED_MODEL"]
    assert "100% of 64 rows" in issue.message and "inside the loss" in issue.fix


def test_pseudo_labels_made_in_the_loss_from_the_current_model_stay_quiet():
    x, y = blobs()

    def online(model, batch):
        x_labelled, labels, x_unlabelled, _ = batch
        with torch.no_grad():
            confidence, pseudo = F.softmax(model(x_unlabelled), 1).max(1)
        unlabelled = (F.cross_entropy(model(x_unlabelled), pseudo, reduction="none") * (confidence > 0.5)).mean()
        return F.cross_entropy(model(x_labelled), labels) + unlabelled

    found = findings(classifier(), TensorDataset(x[:512], y[:512], x[512:], y[512:]), online)
    assert "TARGETS_FROM_UNTRAINED_MODEL" not in found


@pytest.mark.parametrize("trained", [False, True], ids=["true_labels", "trained_model_agreeing"])
def test_true_labels_and_a_trained_model_that_agrees_with_them_stay_quiet(trained):
    x, y = blobs()
    model = classifier()
    if trained:  # weights moved off the default init, predicting the labels it is trained on (a resumed run)
        with torch.no_grad():
            for layer in (model[0], model[2]):
                nn.init.normal_(layer.weight, std=0.3)
            y = model(x).argmax(1)
    found = findings(model, TensorDataset(x, y), nn.CrossEntropyLoss())
    assert "TARGETS_FROM_UNTRAINED_MODEL" not in found
