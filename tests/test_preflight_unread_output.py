"""GRAD_NONE explained by the model's own returns: a head whose result the model returns but the
loss never reads (N-BEATS' forecast, out[0] read for out[1]) is named as such; reading the right
element is quiet; a Hamiltonian network's last bias, which a loss of dH/dz cannot see, is no
finding."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, GradientsCheck

CHECKS = (FirstBatchCheck, FirstStepCheck, GradientsCheck)


class BackcastForecast(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(24, 32), nn.ReLU())
        self.backcast = nn.Linear(32, 24)
        self.forecast = nn.Linear(32, 6)

    def forward(self, x):
        h = self.body(x)
        return self.backcast(h), self.forecast(h)


@pytest.mark.parametrize("element", [0, 1])
def test_a_returned_head_the_loss_never_reads(element):
    g = torch.Generator().manual_seed(0)
    series = torch.randn(256, 30, generator=g).cumsum(1)
    model = BackcastForecast()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(series[:, :24], series[:, 24:]), batch_size=32, shuffle=True),
                           loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0])[element][:, :6], b[1]),
                           checks=[check() for check in CHECKS])
    issues = [i for i in report.check("step.gradients").issues if i.code == "GRAD_NONE"]
    if element == 1:  # the forecast is read; only the backcast head (unused here) is named
        assert all("forecast.weight" not in i.message and "backcast.weight" in i.message for i in issues)
        return
    (issue,) = issues
    assert "forecast.weight" in issue.message
    assert "element 1 of the 2 tensors its forward returns" in issue.message and "reads element 0" in issue.message
    assert "unpack the tuple by name" in issue.fix


class Hamiltonian(nn.Module):
    def __init__(self):
        super().__init__()
        self.H = nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, z):
        z = z.requires_grad_(True)
        (dh,) = torch.autograd.grad(self.H(z).sum(), z, create_graph=True)
        return torch.stack([dh[:, 1], -dh[:, 0]], 1)


def test_the_last_bias_of_a_network_read_through_its_derivative_is_no_finding():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(256, 2, generator=g)
    model = Hamiltonian()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(z, torch.stack([z[:, 1], -z[:, 0]], 1)), batch_size=32,
                                      shuffle=True), loss_fn=nn.MSELoss(), checks=[check() for check in CHECKS])
    result = report.check("step.gradients")
    assert result.issues == [] and result.data["constant_under_derivative"] == ["H.2.bias"]
