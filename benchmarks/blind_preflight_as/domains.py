"""Synthetic data and small models shared by set as's cases (no preflight involved): a 1-D Poisson problem for the
PINNs, a small deterministic MDP for offline Q regression, logged expert trajectories for behaviour cloning, implicit
feedback for the ranking models and a periodic elliptic operator on a 1-D grid for the surrogates."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_as.registry import gen, loader

PI = math.pi


# ----------------------------------------------------------------------------------------------- PINN: u'' = f
def poisson_exact(x, length=1.0):
    """u(x) = sin(pi x / L) on [0, L], u(0) = u(L) = 0, so u'' = -(pi / L)^2 u."""
    return torch.sin(PI * x / length)


def poisson_forcing(x, length=1.0):
    return -(PI / length) ** 2 * torch.sin(PI * x / length)


def pinn_mlp(act=nn.Tanh, width=32):
    return nn.Sequential(nn.Linear(1, width), act(), nn.Linear(width, width), act(), nn.Linear(width, 1))


def collocation_loaders(n=512, length=1.0, s=0, batch=128):
    """Collocation points (x,) in [0, L] for training; (x, u_exact) on a grid for validation."""
    x = torch.rand(n, 1, generator=gen(s)) * length
    xv = torch.linspace(0, length, 201).unsqueeze(1)
    return loader(TensorDataset(x), batch), loader(TensorDataset(xv, poisson_exact(xv, length)), 201, shuffle=False)


def d_dx(y, x):
    return torch.autograd.grad(y, x, grad_outputs=torch.ones_like(y), create_graph=True)[0]


# ------------------------------------------------------------------------------ offline Q regression on a chain
N_STATES, N_ACTIONS, GAMMA = 10, 2, 0.8


def chain_mdp(s=0):
    """A chain of N_STATES cells; action 0 moves left, 1 right; both ends are terminal. Rewards are fixed per
    (state, action) in [-1, 1]. Returns state features (N_STATES, 6), next-state table, reward table, terminal mask
    and Q* by value iteration."""
    g = gen(s)
    feats = torch.randn(N_STATES, 6, generator=g)
    nxt = torch.stack([torch.arange(N_STATES) - 1, torch.arange(N_STATES) + 1], 1).clamp(0, N_STATES - 1)
    rew = torch.rand(N_STATES, N_ACTIONS, generator=g) * 2 - 1
    terminal = torch.zeros(N_STATES, dtype=torch.bool)
    terminal[0] = terminal[-1] = True
    q = torch.zeros(N_STATES, N_ACTIONS)
    for _ in range(200):
        v = q.max(1).values * (~terminal).float()
        q = rew + GAMMA * v[nxt]
    return feats, nxt, rew, terminal, q


def chain_transitions(n=3000, s=0, mdp_seed=0):
    """Uniformly logged transitions (state, action, reward, next state, done) from non-terminal states."""
    feats, nxt, rew, terminal, _ = chain_mdp(mdp_seed)
    g = gen(s + 100)
    st = torch.randint(1, N_STATES - 1, (n,), generator=g)
    a = torch.randint(0, N_ACTIONS, (n,), generator=g)
    s2 = nxt[st, a]
    return feats[st], a, rew[st, a], feats[s2], terminal[s2].float()


def q_net(width=64):
    return nn.Sequential(nn.Linear(6, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, N_ACTIONS))


def q_val_loader(mdp_seed=0):
    """Every non-terminal state's features with its Q* row (validation of the Q regression)."""
    feats, _, _, terminal, q = chain_mdp(mdp_seed)
    keep = ~terminal
    return loader(TensorDataset(feats[keep], q[keep]), 64, shuffle=False)


def q_rmse(model, kw):
    err = n = 0.0
    with torch.no_grad():
        was = model.training
        model.eval()
        for x, q in kw["val_loader"]:
            err += ((model(x) - q) ** 2).sum().item()
            n += q.numel()
        model.train(was)
    return math.sqrt(err / n)


# ------------------------------------------------------------------------------ behaviour cloning trajectories
def expert_trajectories(n_traj=60, length=40, d=6, n_actions=4, s=0, fast=True):
    """Logged trajectories of a discrete expert: a_t = argmax(W s_t); s_{t+1} = 0.3 s_t + e(a_t) + noise, so
    consecutive states are far from each other. Returns states (n_traj, length, d) and actions (n_traj, length)."""
    g = gen(s)
    w = torch.randn(d, n_actions, generator=gen(999))
    effect = torch.randn(n_actions, d, generator=gen(998)) * 0.5
    states = torch.zeros(n_traj, length, d)
    actions = torch.zeros(n_traj, length, dtype=torch.long)
    x = torch.randn(n_traj, d, generator=g)
    for t in range(length):
        a = (x @ w).argmax(1)
        states[:, t], actions[:, t] = x, a
        x = 0.3 * x + effect[a] + torch.randn(n_traj, d, generator=g)
    return states, actions


def policy_mlp(d=6, out=4, width=64):
    return nn.Sequential(nn.Linear(d, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, out))


# ------------------------------------------------------------------------------ implicit feedback for ranking
class Interactions:
    """n_users x n_items with a rank-4 preference; each user's 15 favourite items are their positives, 3 of them
    held out. ``val`` is (user, held-out positive, random non-positive) triples."""

    def __init__(self, n_users=150, n_items=300, s=0):
        g = gen(s)
        self.n_users, self.n_items = n_users, n_items
        uf, itf = torch.randn(n_users, 4, generator=g), torch.randn(n_items, 4, generator=g)
        self.item_features = itf
        scores = uf @ itf.T
        top = scores.topk(15, dim=1).indices
        self.positive = torch.zeros(n_users, n_items, dtype=torch.bool)
        self.positive.scatter_(1, top, True)
        perm = torch.rand(n_users, 15, generator=g).argsort(1)
        held, kept = top.gather(1, perm[:, :3]), top.gather(1, perm[:, 3:])
        self.train_pairs = torch.stack([torch.arange(n_users).repeat_interleave(12), kept.reshape(-1)], 1)
        users = torch.arange(n_users).repeat_interleave(3 * 10)
        pos = held.repeat_interleave(10, dim=1).reshape(-1)
        neg = torch.randint(0, n_items, (users.numel(),), generator=g)
        ok = ~self.positive[users, neg]
        self.val = (users[ok], pos[ok], neg[ok])


def ranking_val_loader(data: Interactions):
    return loader(TensorDataset(*data.val), 512, shuffle=False)


def ranking_auc(score):
    """score(model, users, items) -> scores; the fraction of val triples with the positive ranked above."""
    def metric(model, kw):
        right = n = 0
        with torch.no_grad():
            for u, p, q in kw["val_loader"]:
                right += (score(model, u, p) > score(model, u, q)).sum().item()
                n += u.numel()
        return right / n
    return metric


class MF(nn.Module):
    def __init__(self, n_users, n_items, dim=16):
        super().__init__()
        self.user = nn.Embedding(n_users, dim)
        self.item = nn.Embedding(n_items, dim)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)

    def forward(self, users, items):
        return (self.user(users) * self.item(items)).sum(-1)


class TripletDataset(Dataset):
    """(user, positive item, sampled negative item); the negative is drawn on each access."""

    def __init__(self, pairs, n_items):
        self.pairs, self.n_items = pairs, n_items

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i):
        u, p = self.pairs[i]
        return u, p, torch.randint(0, self.n_items, ()).item()


# ------------------------------------------------------------------------------ operator learning on a 1-D grid
GRID = 64


def elliptic_pairs(n, s=0, grid=GRID):
    """Random smooth coefficient fields a(x) (8 Fourier modes, random amplitude) and the periodic solution u of
    -u'' / 40 + u = a, computed spectrally. Returns a (n, grid), u (n, grid), x (grid,)."""
    g = gen(s)
    x = torch.arange(grid) / grid
    k = torch.arange(1, 9).float()
    amp = torch.rand(n, 1, generator=g) * 2 + 0.2
    ca, cb = torch.randn(n, 8, generator=g), torch.randn(n, 8, generator=g)
    phase = 2 * PI * k[None, :, None] * x[None, None, :]
    a = amp * ((ca[..., None] * torch.cos(phase) + cb[..., None] * torch.sin(phase)) / k[None, :, None]).sum(1)
    a = a + amp * 0.5
    freqs = torch.fft.rfftfreq(grid, d=1 / grid)
    u = torch.fft.irfft(torch.fft.rfft(a) / (1 + (2 * PI * freqs) ** 2 / 40), n=grid)
    return a, u, x


class SpectralConv1d(nn.Module):
    def __init__(self, channels, modes):
        super().__init__()
        self.modes = modes
        scale = 1 / channels
        self.weight = nn.Parameter(scale * torch.randn(channels, channels, modes, dtype=torch.cfloat))

    def forward(self, x):
        x_ft = torch.fft.rfft(x)
        out = torch.zeros(x.shape[0], x.shape[1], x.shape[-1] // 2 + 1, dtype=torch.cfloat, device=x.device)
        out[:, :, :self.modes] = torch.einsum("bim,iom->bom", x_ft[:, :, :self.modes], self.weight.to(x.device))
        return torch.fft.irfft(out, n=x.shape[-1])


def conv_surrogate(cin=2, cout=1, width=32):
    return nn.Sequential(nn.Conv1d(cin, width, 5, padding=2, padding_mode="circular"), nn.GELU(),
                         nn.Conv1d(width, width, 5, padding=2, padding_mode="circular"), nn.GELU(),
                         nn.Conv1d(width, width, 5, padding=2, padding_mode="circular"), nn.GELU(),
                         nn.Conv1d(width, cout, 1))
