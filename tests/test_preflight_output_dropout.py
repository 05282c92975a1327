"""step.output_dropout, DROPOUT_ON_OUTPUT: a regression model whose prediction comes straight
out of a dropout (nn.Dropout after the last layer, or F.dropout on the output), which trains
it to predict (1 - p) times the target. Dropout on hidden activations, and a classifier's
logits, stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.dropout_rate import DropoutOnOutputCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from tests.preflight_support import assert_quiet


class Regressor(nn.Module):
    def __init__(self, where: str):
        super().__init__()
        torch.manual_seed(0)
        self.where = where
        self.hidden, self.out, self.drop = nn.Linear(8, 32), nn.Linear(32, 1), nn.Dropout(0.3)

    def forward(self, x):
        h = torch.relu(self.hidden(x))
        if self.where == "hidden":
            return self.out(self.drop(h))
        if self.where == "functional":
            return F.dropout(self.out(h), 0.2, self.training).squeeze(1)
        return self.drop(self.out(h))


def run(model, targets, criterion):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, targets(x)), batch_size=32, shuffle=True), loss_fn=criterion,
                           checks=[FirstBatchCheck(), FirstStepCheck(), DropoutOnOutputCheck()])
    return report.check("step.output_dropout")


@pytest.mark.parametrize("where,rate", [("module", 0.3), ("functional", 0.2)])
def test_a_dropout_on_a_regression_output_fires(where, rate):
    result = run(Regressor(where), (lambda x: x.sum(1, keepdim=True)) if where == "module" else (lambda x: x.sum(1)),
                 nn.MSELoss())
    issues = [i for i in result.issues if i.code == "DROPOUT_ON_OUTPUT"]
    assert len(issues) == 1 and f"(p={rate:g})" in issues[0].message and "mse_loss" in issues[0].message
    assert "before the last layer" in issues[0].fix


def test_dropout_on_hidden_activations_stays_quiet():
    assert_quiet(run(Regressor("hidden"), lambda x: x.sum(1, keepdim=True), nn.MSELoss()))


def test_a_classifier_whose_logits_pass_a_dropout_is_not_judged():
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3), nn.Dropout(0.3))
    assert_quiet(run(model, lambda x: x[:, :3].argmax(1), nn.CrossEntropyLoss()))
