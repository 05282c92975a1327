"""LOSS_BOUNDED_LOGITS: cross_entropy on logits squashed by a sigmoid or tanh (a loss floor
the model can never go below); raw logits, and a hidden sigmoid before the output
layer, stay quiet."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck

HEADS = {
    "sigmoid_output": (lambda: nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 10), nn.Sigmoid()), True),
    "tanh_output": (lambda: nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 10), nn.Tanh()), True),
    "raw_logits": (lambda: nn.Sequential(nn.Linear(8, 32), nn.Sigmoid(), nn.Linear(32, 10)), False),
}


@pytest.mark.parametrize("head", sorted(HEADS))
def test_logits_out_of_a_bounded_activation_are_an_error(head):
    build, fires = HEADS[head]
    torch.manual_seed(0)
    model = build()
    x, y = torch.randn(512, 8), torch.randint(0, 10, (512,))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    issues = [i for i in report.check("step.loss_function").issues if i.code == "LOSS_BOUNDED_LOGITS"]
    assert bool(issues) == fires
    if head == "sigmoid_output":
        floor = math.log(1 + 9 * math.exp(-1))
        assert f"{floor:.3f}" in issues[0].message and "Remove the sigmoid" in issues[0].fix
