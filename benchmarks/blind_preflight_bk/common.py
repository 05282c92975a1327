"""Shared physics helpers for set bk: small MLPs, autograd derivatives, analytic solutions, simulated trajectories,
and the metrics (relative L2 error in percent, rollout RMSE) each case's fix is scored on."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight.registry import seed

PI = math.pi


def gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(s)


def mlp(i: int, o: int, width: int = 32, depth: int = 3, act=nn.Tanh) -> nn.Sequential:
    layers, d = [], i
    for _ in range(depth):
        layers += [nn.Linear(d, width), act()]
        d = width
    layers.append(nn.Linear(d, o))
    return nn.Sequential(*layers)


def grad(u: torch.Tensor, x: torch.Tensor, create_graph: bool = True) -> torch.Tensor:
    return torch.autograd.grad(u, x, torch.ones_like(u), create_graph=create_graph)[0]


def load(*tensors, batch_size: int = 64, shuffle: bool = True, **kw) -> DataLoader:
    g = torch.Generator().manual_seed(1234) if shuffle else None
    return DataLoader(TensorDataset(*tensors), batch_size=batch_size, shuffle=shuffle, generator=g, **kw)


def rel_l2_pct(model, kw) -> float:
    """Relative L2 error (percent) of model(x) against the exact field over the val_loader's (x, u) pairs."""
    was = model.training
    model.eval()
    num = den = 0.0
    for x, u in kw["val_loader"]:
        p = model(x).detach().reshape(u.shape)
        num += ((p - u) ** 2).sum().item()
        den += (u ** 2).sum().item()
    model.train(was)
    return 100.0 * math.sqrt(num / den)


# ---- analytic fields -------------------------------------------------------------------------------------------

def poisson_val(n: int = 201, lo: float = -1.0, hi: float = 1.0, k: float = PI):
    x = torch.linspace(lo, hi, n).unsqueeze(1)
    return load(x, torch.sin(k * (x - lo) if lo != -1.0 else k * x), batch_size=256, shuffle=False)


def heat_exact(x, t, alpha: float = 0.1):
    return torch.exp(-alpha * PI ** 2 * t) * torch.sin(PI * x)


def heat_val(alpha: float = 0.1):
    xs, ts = torch.linspace(-1, 1, 41), torch.linspace(0, 1, 21)
    X, T = torch.meshgrid(xs, ts, indexing="ij")
    xt = torch.stack([X.reshape(-1), T.reshape(-1)], 1)
    return load(xt, heat_exact(xt[:, :1], xt[:, 1:], alpha), batch_size=512, shuffle=False)


def heat_rows(n: int = 2048, s: int = 0, boundary_round: bool = True, t_init: float = 0.0):
    """Rows [x_c, t_c, x_b, t_b, x_0, t_0]: interior collocation, boundary and initial-condition points."""
    g = gen(s)
    xc, tc = torch.rand(n, 1, generator=g) * 2 - 1, torch.rand(n, 1, generator=g)
    xb = torch.rand(n, 1, generator=g)
    xb = (xb.round() if boundary_round else xb) * 2 - 1
    tb = torch.rand(n, 1, generator=g)
    x0 = torch.rand(n, 1, generator=g) * 2 - 1
    t0 = torch.full((n, 1), t_init)
    return torch.cat([xc, tc, xb, tb, x0, t0], 1)


# ---- dynamics ------------------------------------------------------------------------------------------------

def pendulum_f(z: torch.Tensor) -> torch.Tensor:
    q, p = z[..., :1], z[..., 1:]
    return torch.cat([p, -torch.sin(q)], -1)


def rk4(f, z, dt):
    k1 = f(z)
    k2 = f(z + dt / 2 * k1)
    k3 = f(z + dt / 2 * k2)
    k4 = f(z + dt * k3)
    return z + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def simulate(z0: torch.Tensor, steps: int, dt: float, sub: int = 10) -> torch.Tensor:
    """Pendulum trajectories, time-major (steps + 1, N, 2), integrated with fine RK4 sub-steps."""
    out, z = [z0], z0
    for _ in range(steps):
        for _ in range(sub):
            z = rk4(pendulum_f, z, dt / sub)
        out.append(z)
    return torch.stack(out)


def initial_states(n: int, s: int, qmax: float = 2.0) -> torch.Tensor:
    g = gen(s)
    return torch.cat([(torch.rand(n, 1, generator=g) * 2 - 1) * qmax, (torch.rand(n, 1, generator=g) * 2 - 1)], 1)


def rollout_val(n: int = 64, steps: int = 30, dt: float = 0.1, s: int = 99, qmax: float = 2.0):
    traj = simulate(initial_states(n, s, qmax), steps, dt).transpose(0, 1)  # (N, T, 2)
    return load(traj[:, 0], traj, batch_size=n, shuffle=False)


def rollout_rmse(step):
    """Metric factory: step(model, z) -> next state; RMSE of the rollout against the simulated val trajectories."""
    def metric(model, kw):
        was = model.training
        model.eval()
        se = n = 0.0
        for z0, traj in kw["val_loader"]:
            z = z0
            for t in range(1, traj.shape[1]):
                z = step(model, z).detach()
                se += ((z - traj[:, t]) ** 2).sum().item()
                n += z.numel()
        model.train(was)
        return math.sqrt(se / n) if math.isfinite(se) else float("inf")
    return metric


def adam(model: nn.Module, lr: float = 3e-3, params=None):
    return torch.optim.Adam(model.parameters() if params is None else params, lr=lr)


__all__ = ["seed", "PI", "gen", "mlp", "grad", "load", "rel_l2_pct", "poisson_val", "heat_exact", "heat_val",
           "heat_rows", "pendulum_f", "rk4", "simulate", "initial_states", "rollout_val", "rollout_rmse", "adam"]
