"""Family data: the collocation points, boundary points, simulated pairs or the sampler do not cover what the
physics needs (half of the domain, interior points labelled as boundary, pairs across trajectories, a collate_fn
that reorders inputs but not targets, a sampler left on the low-energy quarter)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

from benchmarks.blind_preflight_bk.common import (PI, adam, gen, grad, heat_rows, heat_val, initial_states, load, mlp,
                                                  poisson_val, rel_l2_pct, rollout_rmse, rollout_val, seed, simulate)
from benchmarks.blind_preflight_bk.cases_mechanics import poisson_loss
from benchmarks.blind_preflight_bk.cases_shapes import EulerStepper
from benchmarks.blind_preflight_bk.registry import case, fix


# 21 -----------------------------------------------------------------------------------------------------------
def poisson_collocation_half_domain(fixed: bool = False) -> dict:
    seed(0)
    model = mlp(1, 1)
    u01 = torch.rand(1024, 1, generator=gen(1))
    x_col = u01 * 2 - 1 if fixed else u01                   # the domain is [-1, 1]
    return dict(model=model, optimizer=adam(model), train_loader=load(x_col), loss_fn=poisson_loss,
                val_loader=poisson_val())


case("poisson_collocation_half_domain", "data",
     "The collocation points are drawn with torch.rand, i.e. in [0, 1), while the Poisson domain is [-1, 1], so the "
     "PDE residual is never enforced on the left half of the domain.",
     r"(collocation|interior|residual) points?.{0,160}(\[0, ?1\)|half (of )?the domain|left half|do not cover|"
     r"cover only|torch\.rand|\[-1, ?1\]|subset of the domain)|(\[0, ?1\)|half (of )?the domain).{0,120}"
     r"(collocation|residual|interior)")(poisson_collocation_half_domain)
fix("poisson_collocation_half_domain", lambda: poisson_collocation_half_domain(fixed=True), rel_l2_pct,
    "rel L2 % vs sin(pi x)", higher=False)


# 22 -----------------------------------------------------------------------------------------------------------
def pairs_collate_sorted_inputs(fixed: bool = False) -> dict:
    seed(0)
    traj = simulate(initial_states(200, 3), 10, 0.1).transpose(0, 1)
    x, y = traj[:, :-1].reshape(-1, 2), traj[:, 1:].reshape(-1, 2)

    def collate(items):                    # ordered by angle q, so the batch is a contiguous sweep of phase space
        xs = torch.stack([i[0] for i in items])
        ys = torch.stack([i[1] for i in items])
        order = xs[:, 0].argsort()
        return xs[order], (ys[order] if fixed else ys)

    model = EulerStepper()
    train = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(1234),
                       collate_fn=collate)
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=train, loss_fn=nn.MSELoss(),
                val_loader=rollout_val())


case("pairs_collate_sorted_inputs", "data",
     "The collate_fn sorts each batch's states by the angle q but leaves the next-state targets in the original "
     "order, so inputs and targets inside a batch are mismatched.",
     r"collate.{0,160}(sort|reorder|permut|order|mismatch|misalign)|(sort|reorder|permut)(s|ed|ing)? .{0,120}"
     r"(inputs?|states?).{0,120}(not|but).{0,40}(targets?|labels?)|(inputs?|states?) and (targets?|labels?|next "
     r"states?).{0,80}(mismatch|misalign|out of order|no longer (correspond|match|align))")(pairs_collate_sorted_inputs)
fix("pairs_collate_sorted_inputs", lambda: pairs_collate_sorted_inputs(fixed=True), rollout_rmse(lambda m, z: m(z)),
    "rollout RMSE (30 steps)", higher=False)


# 23 -----------------------------------------------------------------------------------------------------------
def pairs_across_trajectories(fixed: bool = False) -> dict:
    seed(0)
    traj = simulate(initial_states(400, 3), 3, 0.1).transpose(0, 1)         # 400 short trajectories, 4 frames
    if fixed:
        x, y = traj[:, :-1].reshape(-1, 2), traj[:, 1:].reshape(-1, 2)
    else:
        flat = traj.reshape(-1, 2); x, y = flat[:-1], flat[1:]              # noqa: E702
    model = EulerStepper()
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(x, y), loss_fn=nn.MSELoss(),
                val_loader=rollout_val())


case("pairs_across_trajectories", "data",
     "The (state, next state) pairs are cut from all trajectories concatenated into one sequence, so every "
     "trajectory's last frame is paired with the first frame of the next, unrelated trajectory.",
     r"(pairs?|windows?).{0,160}(across|cross(es|ing)?|span(s|ning)?|straddl).{0,40}(trajector|episode|boundar|"
     r"sequence)|(concatenat|flatten).{0,120}(trajector|episode).{0,120}(pair|window|boundar|next)|last (frame|state)"
     r".{0,80}(first|next trajectory)")(pairs_across_trajectories)
fix("pairs_across_trajectories", lambda: pairs_across_trajectories(fixed=True), rollout_rmse(lambda m, z: m(z)),
    "rollout RMSE (30 steps)", higher=False)


# 24 -----------------------------------------------------------------------------------------------------------
def heat_boundary_points_interior(fixed: bool = False) -> dict:
    seed(0)
    model = mlp(2, 1)
    rows = heat_rows(boundary_round=fixed)

    def loss_fn(model, batch):
        r = batch[0]
        xt = r[:, 0:2].clone().requires_grad_(True)
        du = grad(model(xt), xt)
        res = du[:, 1:2] - 0.1 * grad(du[:, 0:1], xt)[:, 0:1]
        ic = model(r[:, 4:6]) - torch.sin(PI * r[:, 4:5])
        return res.pow(2).mean() + model(r[:, 2:4]).pow(2).mean() + ic.pow(2).mean()

    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=load(rows), loss_fn=loss_fn,
                val_loader=heat_val())


case("heat_boundary_points_interior", "data",
     "The Dirichlet boundary points are sampled as torch.rand(...) * 2 - 1 without rounding to the endpoints, so the "
     "condition u = 0 is imposed at random interior x instead of at x = -1 and x = 1.",
     r"(boundary|dirichlet|\bbc\b).{0,160}(interior|inside the domain|not on the boundary|round|endpoints|x ?= ?[-±]1|"
     r"random x|anywhere)|(interior points?).{0,120}(boundary|dirichlet|u ?= ?0)")(heat_boundary_points_interior)
fix("heat_boundary_points_interior", lambda: heat_boundary_points_interior(fixed=True), rel_l2_pct,
    "rel L2 % vs exact heat solution", higher=False)


# 25 -----------------------------------------------------------------------------------------------------------
def sampler_low_energy_quarter(fixed: bool = False) -> dict:
    seed(0)
    z0 = initial_states(400, 3)
    energy = 0.5 * z0[:, 1] ** 2 + 1 - torch.cos(z0[:, 0])
    z0 = z0[energy.argsort()]                                # trajectories stored by increasing energy
    traj = simulate(z0, 10, 0.1).transpose(0, 1)
    x, y = traj[:, :-1].reshape(-1, 2), traj[:, 1:].reshape(-1, 2)
    n = len(x) if fixed else len(x) // 4
    sampler = SubsetRandomSampler(range(n), generator=torch.Generator().manual_seed(1234))
    model = EulerStepper()
    train = DataLoader(TensorDataset(x, y), batch_size=64, sampler=sampler)
    return dict(model=model, optimizer=adam(model, 3e-3), train_loader=train, loss_fn=nn.MSELoss(),
                val_loader=rollout_val())


case("sampler_low_energy_quarter", "data",
     "The SubsetRandomSampler draws from range(len(dataset) // 4), and the pairs are stored by increasing energy, so "
     "the model only ever sees the lowest-energy quarter of the simulated trajectories.",
     r"(sampler|subset|indices).{0,160}(quarter|// ?4|fraction|part of the (data|dataset)|low(est)?[- ]energy|"
     r"only (a|the) (first|part))|(low(est)?[- ]energy|quarter of the).{0,120}(trajector|data|sampl)")(
    sampler_low_energy_quarter)
fix("sampler_low_energy_quarter", lambda: sampler_low_energy_quarter(fixed=True), rollout_rmse(lambda m, z: m(z)),
    "rollout RMSE (30 steps)", higher=False)
