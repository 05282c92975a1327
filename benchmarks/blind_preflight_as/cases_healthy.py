"""Set as, healthy cases: 5 corrected twins of broken cases and 5 unusual but correct setups of the domain."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_as import domains as D
from benchmarks.blind_preflight_as.cases_data import bc_action_shifted
from benchmarks.blind_preflight_as.cases_shapes import pinn_forcing_broadcast
from benchmarks.blind_preflight_as.cases_targets import bpr_sign_flipped, dqn_no_terminal_mask
from benchmarks.blind_preflight_as.cases_trained import fno_spectral_python_list
from benchmarks.blind_preflight_as.registry import TABLE, gen, healthy, loader, seed, twin

for _name, _builder, _text in [
    ("pinn_forcing_broadcast_fixed", pinn_forcing_broadcast,
     "PINN for u'' = f with the per-point forcing stored as (N, 1) like u_xx."),
    ("dqn_no_terminal_mask_fixed", dqn_no_terminal_mask,
     "Offline Q regression with the TD bootstrap multiplied by (1 - done)."),
    ("bpr_sign_flipped_fixed", bpr_sign_flipped, "Matrix factorisation with BPR -logsigmoid(pos - neg)."),
    ("fno_spectral_python_list_fixed", fno_spectral_python_list,
     "1-D FNO with its spectral layers in an nn.ModuleList."),
    ("bc_action_shifted_fixed", bc_action_shifted, "Behaviour cloning on (s_t, a_t) pairs from logged trajectories."),
]:
    healthy(_name, _text)(twin(_builder))


@healthy("pinn_hard_bc_cosine", "PINN with the Dirichlet conditions built into the ansatz u = x (1 - x) N(x) (no "
         "boundary term at all), SiLU activations and a cosine-annealed learning rate.")
def pinn_hard_bc_cosine():
    seed(0)

    class HardBC(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = D.pinn_mlp(nn.SiLU)

        def forward(self, x):
            return x * (1 - x) * self.net(x)

    model = HardBC()
    x = torch.rand(512, 1, generator=gen(0))

    def loss_fn(model, batch):
        xc = batch[0].clone().requires_grad_(True)
        u = model(xc)
        u_xx = D.d_dx(D.d_dx(u, xc), xc)
        return ((u_xx - D.poisson_forcing(xc)) ** 2).mean() / D.PI ** 4

    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    xv = torch.linspace(0, 1, 201).unsqueeze(1)
    return dict(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2000),
                train_loader=loader(TensorDataset(x), 128), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(xv, D.poisson_exact(xv)), 201, shuffle=False), max_steps=300)


@healthy("dqn_double_polyak_huber", "Offline double-DQN regression: the online network picks the next action, a "
         "Polyak-averaged target network (tau = 0.05) scores it, Huber loss, terminal mask, gradient clipping.")
def dqn_double_polyak_huber():
    seed(0)
    s, a, r, s2, done = D.chain_transitions()
    model = D.q_net()
    target = copy.deepcopy(model).requires_grad_(False)

    def loss_fn(model, batch):
        st, at, rt, s2t, dt = batch
        with torch.no_grad():
            for pt, po in zip(target.parameters(), model.parameters()):
                pt.mul_(0.95).add_(po.detach(), alpha=0.05)
            a2 = model(s2t).argmax(1, keepdim=True)
            y = rt + D.GAMMA * (1 - dt) * target(s2t).gather(1, a2).squeeze(1)
        q = model(st).gather(1, at.unsqueeze(1)).squeeze(1)
        return F.smooth_l1_loss(q, y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(s, a, r, s2, done), 64), loss_fn=loss_fn,
                val_loader=D.q_val_loader(), clip_grad_norm=10.0, max_steps=300)


@healthy("rec_frozen_content_items", "Ranking model whose items are fixed content features (from_pretrained with "
         "freeze=True on purpose) through a trainable projection, trainable user embeddings, BPR loss, SGD with "
         "momentum.")
def rec_frozen_content_items():
    seed(0)
    data = D.Interactions()

    class ContentMF(nn.Module):
        def __init__(self):
            super().__init__()
            self.user = nn.Embedding(data.n_users, 16)
            nn.init.normal_(self.user.weight, std=0.1)
            self.item_features = nn.Embedding.from_pretrained(data.item_features)      # frozen on purpose
            self.proj = nn.Linear(4, 16)

        def forward(self, users, items):
            return (self.user(users) * self.proj(self.item_features(items))).sum(-1)

    model = ContentMF()

    def loss_fn(model, batch):
        u, p, q = batch
        return F.softplus(model(u, q) - model(u, p)).mean()

    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
                train_loader=loader(D.TripletDataset(data.train_pairs, data.n_items), 128), loss_fn=loss_fn,
                val_loader=D.ranking_val_loader(data), max_steps=300)


@healthy("bc_discrete_accum_bf16", "Discrete behaviour cloning with label smoothing 0.1, 4-step gradient "
         "accumulation, bf16, AdamW with weight decay and gradient clipping.")
def bc_discrete_accum_bf16():
    seed(0)
    states, actions = D.expert_trajectories(n_traj=100, length=40, s=2)
    vs, va = D.expert_trajectories(n_traj=30, length=40, s=3)
    model = D.policy_mlp()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01),
                train_loader=loader(TensorDataset(states.reshape(-1, 6), actions.reshape(-1)), 32),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1),
                val_loader=loader(TensorDataset(vs.reshape(-1, 6), va.reshape(-1)), 400, shuffle=False),
                accumulation_steps=4, precision="bf16", clip_grad_norm=1.0, max_steps=300)


@healthy("surrogate_channels_last_relative_l2", "Channels-last (B, N, C) grids permuted to (B, C, N) for a conv "
         "surrogate, trained with the relative L2 loss of operator learning and a OneCycle schedule.")
def surrogate_channels_last_relative_l2():
    seed(0)
    a, u, x = D.elliptic_pairs(1200, s=11)
    grid = torch.stack([a, x.expand_as(a)], -1)

    class Surrogate(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = D.conv_surrogate(2, 1)

        def forward(self, g):
            return self.net(g.permute(0, 2, 1)).squeeze(1)

    def relative_l2(model, batch):
        g, target = batch
        pred = model(g)
        return ((pred - target).norm(dim=1) / target.norm(dim=1)).mean()

    model = Surrogate()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=opt,
                scheduler=torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=5000),
                train_loader=loader(TensorDataset(grid[:1000], u[:1000]), 32), loss_fn=relative_l2,
                val_loader=loader(TensorDataset(grid[1000:], u[1000:]), 100, shuffle=False), max_steps=300)


assert TABLE  # registered on import
