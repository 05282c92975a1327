"""GRAD_ZERO for a loss term multiplied by a constant 0 (a weight read with .get(key, 0.0)
under a misspelt key): its head gets exactly zero gradient; a real weight stays quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, GradientsCheck


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk, self.kind, self.age = nn.Linear(8, 16), nn.Linear(16, 3), nn.Linear(16, 1)

    def forward(self, x):
        h = torch.relu(self.trunk(x))
        return self.kind(h), self.age(h).squeeze(-1)


@pytest.mark.parametrize("key, fires", [("age_years", True), ("age", False)])
def test_a_loss_term_weighted_by_zero(key, fires):
    weights = {"kind": 1.0, "age": 0.5}

    def loss(model, batch):
        x, kind, age = batch
        kind_logits, age_pred = model(x)
        return (weights.get("kind", 0.0) * nn.functional.cross_entropy(kind_logits, kind)
                + weights.get(key, 0.0) * nn.functional.mse_loss(age_pred, age))

    x = torch.randn(256, 8)
    dataset = TensorDataset(x, torch.randint(0, 3, (256,)), torch.randn(256))
    model = TwoHeads()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(dataset, batch_size=32, shuffle=True), loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), GradientsCheck()])
    issues = [i for i in report.check("step.gradients").issues if i.code == "GRAD_ZERO"]
    assert bool(issues) == fires
    if fires:
        assert "age.weight" in issues[0].message and ".get(key, 0.0)" in issues[0].message
