"""DERIVATIVE_VANISHES (step.derivative_graph): a physics-informed loss that differentiates a
ReLU network twice gets a second derivative of exactly zero at every point, so its PDE's
second-order term never acts; the same loss on a tanh network, and a loss with one
derivative only, stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.autograd_calls import all_zero
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.derivative_graph import DerivativeGraphCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def heat_equation_loss(model, batch):
    """u_t = 0.1 u_xx on (x, t) collocation points, u(x, 0) = sin(pi x)."""
    (points,) = batch
    points = points.clone().requires_grad_(True)
    u = model(points)
    du = torch.autograd.grad(u.sum(), points, create_graph=True)[0]
    u_xx = torch.autograd.grad(du[:, 0].sum(), points, create_graph=True)[0][:, :1]
    initial = torch.cat([points[:, :1], torch.zeros_like(points[:, :1])], 1)
    return ((du[:, 1:] - 0.1 * u_xx) ** 2).mean() + (model(initial) - torch.sin(torch.pi * points[:, :1])).pow(2).mean()


def gradient_penalty_loss(model, batch):
    (points,) = batch
    points = points.clone().requires_grad_(True)
    out = model(points)
    slope = torch.autograd.grad(out.sum(), points, create_graph=True)[0]
    return out.mean() + ((slope.norm(dim=1) - 1) ** 2).mean()


def report(activation: type[nn.Module], loss_fn):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), activation(), nn.Linear(32, 32), activation(), nn.Linear(32, 1))
    data = TensorDataset(torch.rand(512, 2, generator=torch.Generator().manual_seed(1)))
    return run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=128, shuffle=True),
                         loss_fn=loss_fn, checks=[FirstBatchCheck(), FirstStepCheck(), DerivativeGraphCheck()])


def test_a_relu_pinn_whose_second_derivative_is_zero_fires():
    issues = [i for i in report(nn.ReLU, heat_equation_loss).check("step.derivative_graph").issues
              if i.code == "DERIVATIVE_VANISHES"]
    assert len(issues) == 1 and "ReLU activations are piecewise linear" in issues[0].message
    assert "nn.Tanh()" in issues[0].fix


@pytest.mark.parametrize("activation, loss_fn", [(nn.Tanh, heat_equation_loss), (nn.SiLU, heat_equation_loss),
                                                 (nn.ReLU, gradient_penalty_loss)],
                         ids=["tanh_pinn", "silu_pinn", "relu_gradient_penalty"])
def test_smooth_networks_and_a_single_derivative_are_quiet(activation, loss_fn):
    assert not report(activation, loss_fn).check("step.derivative_graph").issues


def test_all_zero_needs_real_points():
    assert all_zero((torch.zeros(16, 1),)) and all_zero((None, torch.zeros(8)))
    assert not all_zero((torch.zeros(4),)) and not all_zero((torch.zeros(15).index_fill(0, torch.tensor([3]), 1.0),))


def heat_residual(per_column: bool):
    def loss_fn(model, batch):
        xt = batch[0].clone().requires_grad_(True)
        u = model(xt)
        (du,) = torch.autograd.grad(u, xt, torch.ones_like(u), create_graph=True)  # (N, 2): [u_x, u_t]
        u_t = du[:, 1:2]
        if per_column:
            u_x = du[:, 0:1]
            u_xx = torch.autograd.grad(u_x, xt, torch.ones_like(u_x), create_graph=True)[0][:, 0:1]
        else:  # the whole gradient differentiated again: u_xx + u_tx in the first column
            u_xx = torch.autograd.grad(du, xt, torch.ones_like(du), create_graph=True)[0][:, 0:1]
        return (u_t - 0.1 * u_xx).pow(2).mean()
    return loss_fn


@pytest.mark.parametrize("per_column", [False, True])
def test_a_second_derivative_of_the_whole_gradient_sums_the_columns(per_column):
    points = torch.rand(256, 2, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(points), batch_size=32, shuffle=True), loss_fn=heat_residual(per_column),
                           checks=[FirstBatchCheck(), FirstStepCheck(), DerivativeGraphCheck()])
    issues = report.check("step.derivative_graph").issues
    assert [i.code for i in issues] == ([] if per_column else ["DERIVATIVE_SUMS_COLUMNS"])
    if issues:
        assert "u_xx + u_tx" in issues[0].message and "du[:, 0:1]" in issues[0].fix
