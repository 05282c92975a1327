"""Family targets: the quantity the loss pulls toward is not the physics the user meant (sign of a source term,
finite-difference targets, initial-condition time, the increment an integrator needs)."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_bk.common import (PI, adam, gen, grad, heat_rows, heat_val, initial_states, load, mlp,
                                                  poisson_val, rel_l2_pct, rk4, rollout_rmse, rollout_val, seed,
                                                  simulate)
from benchmarks.blind_preflight_bk.registry import case, fix

BC = torch.tensor([[-1.0], [1.0]])


# 6 ------------------------------------------------------------------------------------------------------------
def poisson_source_sign(fixed: bool = False) -> dict:
    seed(0)
    model = mlp(1, 1)
    x_col = torch.rand(1024, 1, generator=gen(1)) * 2 - 1
    # -u'' = f with the exact solution u = sin(pi x): f = pi^2 sin(pi x)
    sign = 1.0 if fixed else -1.0

    def loss_fn(model, batch):
        x = batch[0].clone().requires_grad_(True)
        u = model(x)
        f = sign * PI ** 2 * torch.sin(PI * x)
        residual = -grad(grad(u, x), x) - f
        return residual.pow(2).mean() + 10 * model(BC).pow(2).mean()

    return dict(model=model, optimizer=adam(model), train_loader=load(x_col), loss_fn=loss_fn,
                val_loader=poisson_val())


case("poisson_source_sign", "targets",
     "The Poisson residual -u'' - f uses f = -pi^2 sin(pi x), the source of u'' = f, so with the minus convention the "
     "PINN converges to -sin(pi x) instead of sin(pi x).",
     r"sign.{0,120}(source|forcing|right[- ]hand side|residual|pde|laplacian|f\b)|(source|forcing|right[- ]hand side|"
     r"laplacian|u'').{0,120}(sign|negat|minus|flipped|opposite)")(poisson_source_sign)
fix("poisson_source_sign", lambda: poisson_source_sign(fixed=True), rel_l2_pct, "rel L2 % vs sin(pi x)", higher=False)


# 7 ------------------------------------------------------------------------------------------------------------
def subsampled_dt_targets(fixed: bool = False) -> dict:
    seed(0)
    dt = 0.05
    traj = simulate(initial_states(200, 3), 20, dt).transpose(0, 1)[:, ::2]   # keep every 2nd frame
    dt_data = 2 * dt if fixed else dt
    x = traj[:, :-1].reshape(-1, 2)
    y = ((traj[:, 1:] - traj[:, :-1]) / dt_data).reshape(-1, 2)               # finite-difference derivative
    model = mlp(2, 2, 64)
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(x, y), loss_fn=nn.MSELoss(),
                val_loader=rollout_val(dt=0.1))


case("subsampled_dt_targets", "targets",
     "The trajectories are subsampled with [:, ::2] but the finite-difference derivative targets still divide by the "
     "original time step dt instead of 2*dt, so the learned vector field is twice too fast.",
     r"(time[- ]?step|\bdt\b|delta t|stride|subsampl).{0,140}(finite[- ]difference|derivative|divid|2 ?\* ?dt|twice|"
     r"factor of 2|stride|subsampl|::2)|(finite[- ]difference|derivative).{0,100}(time[- ]?step|\bdt\b|stride|"
     r"subsampl)")(subsampled_dt_targets)
fix("subsampled_dt_targets", lambda: subsampled_dt_targets(fixed=True),
    rollout_rmse(lambda m, z: rk4(m, z, 0.1)), "rollout RMSE (30 RK4 steps)", higher=False)


# 8 ------------------------------------------------------------------------------------------------------------
class HNN(nn.Module):
    """Hamiltonian network: H(q, p) by an MLP, time derivative (dH/dp, -dH/dq) by autograd."""

    def __init__(self):
        super().__init__()
        self.H = mlp(2, 1, 64)

    def forward(self, z):
        with torch.enable_grad():
            z = z.detach().requires_grad_(True) if not z.requires_grad else z
            dH = torch.autograd.grad(self.H(z).sum(), z, create_graph=True)[0]
        return torch.cat([dH[:, 1:2], -dH[:, 0:1]], 1)


def hnn_reversed_difference(fixed: bool = False) -> dict:
    seed(0)
    dt = 0.05
    traj = simulate(initial_states(200, 3), 10, dt).transpose(0, 1)
    x = traj[:, :-1].reshape(-1, 2)
    diff = (traj[:, 1:] - traj[:, :-1]) if fixed else (traj[:, :-1] - traj[:, 1:])
    y = (diff / dt).reshape(-1, 2)
    model = HNN()
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(x, y), loss_fn=nn.MSELoss(),
                val_loader=rollout_val())


case("hnn_reversed_difference", "targets",
     "The Hamiltonian network's derivative targets are (z[t] - z[t+1]) / dt, the backward-in-time difference, so the "
     "network learns the time-reversed flow (H flipped in sign) and rolls trajectories backwards.",
     r"(finite[- ]difference|difference|derivative target|target).{0,120}(revers|backward|sign|z\[t\] - z\[t ?\+ ?1\]|"
     r"order|swapped|negat)|(time[- ]revers|backward in time|reversed (flow|time)|wrong sign).{0,120}(target|"
     r"derivative|difference|flow|hamiltonian)")(hnn_reversed_difference)
fix("hnn_reversed_difference", lambda: hnn_reversed_difference(fixed=True),
    rollout_rmse(lambda m, z: rk4(m, z, 0.1)), "rollout RMSE (30 RK4 steps)", higher=False)


# 9 ------------------------------------------------------------------------------------------------------------
def euler_state_not_increment(fixed: bool = False) -> dict:
    seed(0)
    dt = 0.1
    traj = simulate(initial_states(200, 3), 10, dt).transpose(0, 1)
    x, nxt = traj[:, :-1].reshape(-1, 2), traj[:, 1:].reshape(-1, 2)
    y = (nxt - x) / dt if fixed else nxt                    # the model is the vector field f in z + dt f(z)
    model = mlp(2, 2, 64)
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(x, y), loss_fn=nn.MSELoss(),
                val_loader=rollout_val())


case("euler_state_not_increment", "targets",
     "The vector-field network used in the Euler step z + dt * f(z) is regressed onto the next state z[t+1] instead "
     "of the increment (z[t+1] - z[t]) / dt, so the rollout adds dt times a whole state every step.",
     r"(next state|z\[t ?\+ ?1\]|state itself|absolute state).{0,140}(instead of|rather than|not).{0,60}(increment|"
     r"difference|derivative|delta|z\[t ?\+ ?1\] - z\[t\])|(increment|difference|derivative|delta|residual).{0,120}"
     r"(not|instead of|rather than).{0,40}(next state|the state)")(euler_state_not_increment)
fix("euler_state_not_increment", lambda: euler_state_not_increment(fixed=True),
    rollout_rmse(lambda m, z: z + 0.1 * m(z)), "rollout RMSE (30 Euler steps)", higher=False)


# 10 -----------------------------------------------------------------------------------------------------------
def heat_initial_at_final_time(fixed: bool = False) -> dict:
    seed(0)
    model = mlp(2, 1)
    rows = heat_rows(t_init=0.0 if fixed else 1.0)

    def loss_fn(model, batch):
        r = batch[0]
        xt = r[:, 0:2].clone().requires_grad_(True)
        u = model(xt)
        du = grad(u, xt)
        u_xx = grad(du[:, 0:1], xt)[:, 0:1]
        res = du[:, 1:2] - 0.1 * u_xx
        ic = model(r[:, 4:6]) - torch.sin(PI * r[:, 4:5])
        return res.pow(2).mean() + model(r[:, 2:4]).pow(2).mean() + ic.pow(2).mean()

    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(rows), loss_fn=loss_fn,
                val_loader=heat_val())


case("heat_initial_at_final_time", "targets",
     "The initial-condition points of the heat-equation PINN are built with t = 1 (the end of the time window) "
     "instead of t = 0, so u(x, T) = sin(pi x) is imposed and the solution is fitted backwards from the wrong time.",
     r"(initial[- ]condition|\bic\b|initial (points|time)).{0,140}(t ?= ?1|final time|end of the (time )?(window|"
     r"interval|domain)|wrong time|t ?= ?0|t_?max|last time)|(t ?= ?1|final time).{0,100}(initial|\bic\b)")(
    heat_initial_at_final_time)
fix("heat_initial_at_final_time", lambda: heat_initial_at_final_time(fixed=True), rel_l2_pct,
    "rel L2 % vs exact heat solution", higher=False)
