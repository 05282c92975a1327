"""Facts behind set bk's broken cases, printed without the preflight; importing this module attaches each to
``FIXES[name]["fact"]`` for ``verify.py``."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_bk.common import PI, grad, heat_rows, initial_states, mlp, pendulum_f, simulate
from benchmarks.blind_preflight_bk.registry import FIXES


def _shape_broadcast():
    u_xx, f = torch.zeros(64, 1), torch.zeros(64)
    print("  (N, 1) - (N,) ->", tuple((u_xx - f).shape))


def _high_modes():
    xf = torch.fft.rfft(torch.randn(1, 1, 64), dim=-1)
    print("  rfft bins", xf.shape[-1], "; [..., -12:] keeps bins", list(range(xf.shape[-1]))[-12:][:3], "...")


def _meshgrid():
    xs, ys = torch.tensor([0.0, 1.0]), torch.tensor([10.0, 20.0])
    print("  meshgrid xy X[0, 1] =", torch.meshgrid(xs, ys, indexing="xy")[0][0, 1].item(),
          "; ij X[0, 1] =", torch.meshgrid(xs, ys, indexing="ij")[0][0, 1].item())


def _view():
    t = torch.arange(6).reshape(3, 2)          # (T=3, N=2): entry = time * 2 + trajectory
    print("  reshape(N, T):", t.reshape(2, 3).tolist(), "vs transpose:", t.T.tolist())


def _mixed():
    xt = torch.tensor([[0.3, 0.5]], requires_grad=True)
    u = torch.sin(PI * xt[:, :1]) * torch.exp(-xt[:, 1:])
    du = grad(u, xt)
    print("  grad(du) [:,0] =", grad(du, xt)[0, 0].item(), "; grad(du[:, :1]) [:,0] =", grad(du[:, :1], xt)[0, 0].item())


def _sign():
    x = torch.tensor([[0.5]], requires_grad=True)
    u = torch.sin(PI * x)
    print("  -u'' of sin(pi x) at 0.5:", (-grad(grad(u, x), x)).item(), "; pi^2 sin(pi/2) =", PI ** 2)


def _stride():
    traj = simulate(initial_states(4, 3), 4, 0.05).transpose(0, 1)[:, ::2]
    fd = (traj[:, 1] - traj[:, 0]) / 0.05
    print("  |finite difference / dt| / |true derivative| =", (fd.norm() / pendulum_f(traj[:, 0]).norm()).item())


def _reversed():
    traj = simulate(initial_states(1, 3), 1, 0.05)
    print("  (z[t] - z[t+1]) / dt =", ((traj[0] - traj[1]) / 0.05).tolist(), "; true dq/dt = p =", traj[0, 0, 1].item())


def _increment():
    traj = simulate(initial_states(1, 3), 1, 0.1)
    print("  next state", traj[1].tolist(), "vs (z1 - z0)/dt", ((traj[1] - traj[0]) / 0.1).tolist())


def _ic_time():
    print("  initial-condition t column:", heat_rows(8, t_init=1.0)[:3, 5].tolist())


def _head():
    m = nn.Sequential(nn.Linear(2, 2))
    opt = torch.optim.Adam(m.parameters())
    m[0] = nn.Linear(2, 2)
    print("  new head weight in optimizer:", any(p is m[0].weight for g in opt.param_groups for p in g["params"]))


def _no_graph():
    x = torch.tensor([[0.2]], requires_grad=True)
    u_x = grad(mlp(1, 1)(x), x)
    u_xx = torch.autograd.grad(u_x, x, torch.ones_like(u_x), create_graph=False)[0]
    print("  u_xx.requires_grad with create_graph=False:", u_xx.requires_grad)


def _unregistered():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.alpha = torch.tensor(0.5).requires_grad_(True)
    print("  parameters of a module with a plain alpha tensor:", len(list(M().parameters())))


def _plain_spectral():
    from benchmarks.blind_preflight_bk.cases_trained import fno_weights_plain_tensor
    kw = fno_weights_plain_tensor()
    print("  complex tensors in model.parameters():", sum(p.is_complex() for p in kw["model"].parameters()))


def _trunk():
    from benchmarks.blind_preflight_bk.cases_trained import deeponet_trunk_left_out
    kw = deeponet_trunk_left_out()
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  trunk tensors in optimizer:", sum(id(p) in ids for p in kw["model"].trunk.parameters()))


def _relu():
    x = torch.linspace(-1, 1, 5).unsqueeze(1).requires_grad_(True)
    u = mlp(1, 1, act=nn.ReLU)(x)
    print("  ReLU net u_xx:", grad(grad(u, x), x).flatten().tolist())


def _normalised():
    x = torch.tensor([[1.0]], requires_grad=True)
    xn = (x - 2) / 2
    u = torch.sin(PI / 2 * (2 * xn + 2))
    print("  u_xx wrt xn / u_xx wrt x =", (grad(grad(u, xn), xn) / grad(grad(u, x), x)).item())


def _padding():
    a = torch.arange(4.0).view(1, 1, 4)
    print("  zeros pad:", nn.functional.pad(a, (1, 1)).tolist(), "circular:",
          nn.functional.pad(a, (1, 1), mode="circular").tolist())


def _cos_only():
    x = torch.tensor([[0.3], [-0.3]])
    B = torch.randn(1, 4)
    print("  cos features equal at +-x:", torch.allclose(torch.cos(2 * PI * x[:1] @ B), torch.cos(2 * PI * x[1:] @ B)))


def _mean_sq():
    r = torch.tensor([1.0, -1.0])
    print("  residual [1, -1]: mean()**2 =", r.mean().pow(2).item(), "; (r**2).mean() =", r.pow(2).mean().item())


def _half_domain():
    x = torch.rand(1000, 1)
    print("  torch.rand min / max:", x.min().item(), x.max().item(), "(domain [-1, 1])")


def _collate():
    xs, ys = torch.tensor([3.0, 1.0, 2.0]), torch.tensor([30.0, 10.0, 20.0])
    o = xs.argsort()
    print("  sorted inputs", xs[o].tolist(), "with unsorted targets", ys.tolist())


def _across():
    traj = simulate(initial_states(2, 3), 3, 0.1).transpose(0, 1)
    flat = traj.reshape(-1, 2)
    print("  pair 3 -> 4 jumps by", (flat[4] - flat[3]).norm().item(), "vs in-trajectory", (flat[1] - flat[0]).norm().item())


def _boundary():
    print("  boundary x column (unrounded):", heat_rows(8, boundary_round=False)[:4, 2].tolist())


def _sampler():
    z0 = initial_states(400, 3)
    e = (0.5 * z0[:, 1] ** 2 + 1 - torch.cos(z0[:, 0])).sort().values
    print("  energy max of the first quarter", e[99].item(), "vs overall max", e[-1].item())


FACTS = {
    "poisson_forcing_broadcast": _shape_broadcast, "fno_high_modes_kept": _high_modes, "grid_meshgrid_xy": _meshgrid,
    "trajectory_view_not_transpose": _view, "heat_mixed_derivative": _mixed, "poisson_source_sign": _sign,
    "subsampled_dt_targets": _stride, "hnn_reversed_difference": _reversed, "euler_state_not_increment": _increment,
    "heat_initial_at_final_time": _ic_time, "surrogate_head_swapped": _head, "poisson_residual_no_graph": _no_graph,
    "heat_alpha_unregistered": _unregistered, "fno_weights_plain_tensor": _plain_spectral,
    "deeponet_trunk_left_out": _trunk, "poisson_relu_pinn": _relu, "pinn_grad_normalised_coords": _normalised,
    "periodic_cnn_zero_padding": _padding, "fourier_features_cos_only": _cos_only,
    "ode_residual_mean_then_square": _mean_sq, "poisson_collocation_half_domain": _half_domain,
    "pairs_collate_sorted_inputs": _collate, "pairs_across_trajectories": _across,
    "heat_boundary_points_interior": _boundary, "sampler_low_energy_quarter": _sampler,
}

from benchmarks.blind_preflight_bk.registry import load_all  # noqa: E402

load_all()
for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
