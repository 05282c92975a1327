"""Healthy cases: five corrected twins of broken cases and five unusual but correct setups of the domain."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.blind_preflight_bk import cases_data, cases_mechanics, cases_shapes, cases_trained
from benchmarks.blind_preflight_bk.common import (PI, adam, gen, grad, initial_states, load, mlp, pendulum_f,
                                                  poisson_val, rk4, rollout_val, seed, simulate)
from benchmarks.blind_preflight_bk.registry import healthy, twin

# ---- corrected twins -----------------------------------------------------------------------------------------
healthy("poisson_forcing_broadcast_fixed", "Twin: the Poisson source term kept as an (N, 1) column.")(
    twin(cases_shapes.poisson_forcing_broadcast))
healthy("fno_weights_plain_tensor_fixed", "Twin: the spectral weights registered as nn.Parameter.")(
    twin(cases_trained.fno_weights_plain_tensor))
healthy("pinn_grad_normalised_coords_fixed", "Twin: derivatives taken with respect to the physical coordinate.")(
    twin(cases_mechanics.pinn_grad_normalised_coords))
healthy("pairs_collate_sorted_inputs_fixed", "Twin: the collate_fn reorders inputs and targets together.")(
    twin(cases_data.pairs_collate_sorted_inputs))
healthy("heat_alpha_unregistered_fixed", "Twin: the unknown diffusivity is an nn.Parameter trained with the PINN.")(
    twin(cases_trained.heat_alpha_unregistered))


# ---- unusual but correct -------------------------------------------------------------------------------------
class HardBCPINN(nn.Module):
    """u(x) = (1 - x^2) N(x): the Dirichlet conditions u(-1) = u(1) = 0 hold by construction (no boundary loss)."""

    def __init__(self):
        super().__init__()
        self.net = mlp(1, 1)

    def forward(self, x):
        return (1 - x ** 2) * self.net(x)


@healthy("poisson_hard_bc_ansatz", "Poisson PINN whose boundary conditions are built into the output ansatz; the "
         "loss has only the PDE residual.")
def poisson_hard_bc_ansatz() -> dict:
    seed(0)
    model = HardBCPINN()
    x_col = torch.rand(1024, 1, generator=gen(1)) * 2 - 1

    def loss_fn(model, batch):
        x = batch[0].clone().requires_grad_(True)
        residual = grad(grad(model(x), x), x) + PI ** 2 * torch.sin(PI * x)
        return residual.pow(2).mean()

    return dict(model=model, optimizer=adam(model), train_loader=load(x_col), loss_fn=loss_fn,
                val_loader=poisson_val())


class RK4Stepper(nn.Module):
    """A learned vector field integrated by one classical RK4 step inside forward."""

    def __init__(self, dt: float = 0.1):
        super().__init__()
        self.f, self.dt = mlp(2, 2, 64), dt

    def forward(self, z):
        return rk4(self.f, z, self.dt)


@healthy("rk4_stepper_pairs", "A neural vector field trained through an RK4 step on simulated (state, next state) "
         "pairs of a pendulum.")
def rk4_stepper_pairs() -> dict:
    seed(0)
    traj = simulate(initial_states(200, 3), 10, 0.1).transpose(0, 1)
    x, y = traj[:, :-1].reshape(-1, 2), traj[:, 1:].reshape(-1, 2)
    model = RK4Stepper()
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(x, y), loss_fn=nn.MSELoss(),
                val_loader=rollout_val())


class PairEnergy(nn.Module):
    """Permutation- and rotation-invariant energy: a learned pair potential of inter-particle distances, summed."""

    def __init__(self):
        super().__init__()
        self.phi = mlp(1, 1, 32, 2)

    def forward(self, pos):                                  # pos: (B, P, 2)
        d = torch.cdist(pos, pos)
        i, j = torch.triu_indices(pos.shape[1], pos.shape[1], 1)
        return self.phi(d[:, i, j].unsqueeze(-1)).sum((1, 2))


def spring_energy(pos):
    d = torch.cdist(pos, pos)
    i, j = torch.triu_indices(pos.shape[1], pos.shape[1], 1)
    return ((d[:, i, j] - 1.0) ** 2).sum(1)


@healthy("particle_pair_energy", "Deep-set style energy of 4 particles from pairwise distances (invariant to "
         "rotations and to permuting particles), regressed on spring energies.")
def particle_pair_energy() -> dict:
    seed(0)
    pos = torch.randn(1200, 4, 2, generator=gen(6))
    e = spring_energy(pos)
    model = PairEnergy()
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(pos[:1000], e[:1000]),
                loss_fn=nn.MSELoss(), val_loader=load(pos[1000:], e[1000:], batch_size=200, shuffle=False))


class HardICODE(nn.Module):
    """u(t) = 1 + t N(t): the initial condition u(0) = 1 holds by construction."""

    def __init__(self):
        super().__init__()
        self.net = mlp(1, 1)

    def forward(self, t):
        return 1 + t * self.net(t)


@healthy("ode_hard_ic_pinn", "ODE PINN for u' = -2u with the initial condition built into the ansatz.")
def ode_hard_ic_pinn() -> dict:
    seed(0)
    model = HardICODE()
    t_col = torch.rand(1024, 1, generator=gen(1)) * 1.5

    def loss_fn(model, batch):
        t = batch[0].clone().requires_grad_(True)
        u = model(t)
        return (grad(u, t) + 2.0 * u).pow(2).mean()

    tv = torch.linspace(0, 1.5, 151).unsqueeze(1)
    return dict(model=model, optimizer=adam(model), train_loader=load(t_col), loss_fn=loss_fn,
                val_loader=load(tv, torch.exp(-2 * tv), batch_size=151, shuffle=False))


class NoisyPairs(Dataset):
    """(state, next state) pairs with small Gaussian input noise drawn per item (noise injection for rollouts)."""

    def __init__(self, x, y, sigma: float = 0.01):
        self.x, self.y, self.sigma = x, y, sigma

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        noise = self.sigma * torch.randn(2)
        return self.x[i] + noise, self.y[i] + noise


@healthy("noise_injected_pairs", "A learned Euler stepper trained on pendulum pairs with the same small noise added "
         "to the input state and its target (training-noise injection for stable rollouts).")
def noise_injected_pairs() -> dict:
    seed(0)
    traj = simulate(initial_states(200, 3), 10, 0.1).transpose(0, 1)
    x, y = traj[:, :-1].reshape(-1, 2), traj[:, 1:].reshape(-1, 2)
    model = cases_shapes.EulerStepper()
    train = DataLoader(NoisyPairs(x, y), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(1234))
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=train, loss_fn=nn.MSELoss(),
                val_loader=rollout_val())


__all__ = ["pendulum_f"]
