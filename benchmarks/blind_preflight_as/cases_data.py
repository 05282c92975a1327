"""Set as, family data: the samples the loader hands over are not the ones the user meant."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_as import domains as D
from benchmarks.blind_preflight_as.registry import case, gen, loader, seed


def bc_pairs(states, actions, fixed):
    """Flatten logged trajectories to (state, action) pairs."""
    if fixed:
        return states.reshape(-1, 6), actions.reshape(-1)
    # "the action recorded next to obs t+1 is the one that produced it": pair s_t with a_{t+1}
    return states[:, :-1].reshape(-1, 6), actions[:, 1:].reshape(-1)


@case("bc_action_shifted", "data",
      "The logged trajectories are flattened pairing state s_t with action a_{t+1} (states[:, :-1] with "
      "actions[:, 1:]), an off-by-one between observations and actions, so the policy is cloned onto the next "
      "step's action, which the current state does not determine; pair s_t with a_t.",
      r"off.?by.?one|(misalign|shift|offset|lag).{0,40}(between )?(state|obs|observation)s?.{0,20}(and|vs|with|/) ?actions?|"
      r"(state|obs|observation)s?.{0,30}(and|vs|with|/) ?actions?.{0,30}(misalign|shifted|offset|lagg)|"
      r"a_?\{?t ?\+ ?1|actions\[:, ?1:\]|next (step'?s? )?action")
def bc_action_shifted(fixed: bool = False):
    seed(0)
    states, actions = D.expert_trajectories(n_traj=100, length=40, s=0)
    vs, va = D.expert_trajectories(n_traj=30, length=40, s=1)
    x, y = bc_pairs(states, actions, fixed)
    model = D.policy_mlp()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(vs.reshape(-1, 6), va.reshape(-1)), 400, shuffle=False),
                max_steps=300)


def logged_episodes(n_eps, s):
    """Random-policy episodes on the chain MDP until a terminal cell: concatenated obs, actions, rewards, done."""
    feats, nxt, rew, terminal, _ = D.chain_mdp(0)
    g = gen(s)
    cells, acts = [], []
    for _ in range(n_eps):
        c = torch.randint(1, D.N_STATES - 1, (), generator=g).item()
        while not terminal[c]:
            a = torch.randint(0, D.N_ACTIONS, (), generator=g).item()
            cells.append(c)
            acts.append(a)
            c = nxt[c, a].item()
    cells, acts = torch.tensor(cells), torch.tensor(acts)
    nxt_cells = nxt[cells, acts]
    return feats[cells], acts, rew[cells, acts], terminal[nxt_cells].float()


@case("dqn_next_state_rolled", "data",
      "The replay buffer builds next_obs from the concatenated log with torch.roll(obs, 1, 0), which shifts the "
      "wrong way and pairs each transition with the PREVIOUS observation, so the TD target bootstraps from s_{t-1} "
      "instead of s_{t+1}; use roll(obs, -1, 0) / obs[1:].",
      r"(next.?obs|next.?state|s_?\{?t ?\+ ?1|s').*(previous|wrong|shift|roll|misalign)|roll.*(direction|-1|wrong|"
      r"previous|sign)|(previous|prior|last) (observation|state)|s_?\{?t ?- ?1")
def dqn_next_state_rolled(fixed: bool = False):
    seed(0)
    obs, act, rew, done = logged_episodes(250, 0)
    next_obs = torch.roll(obs, -1 if fixed else 1, 0)
    model = D.q_net()
    target = copy.deepcopy(model).requires_grad_(False)
    calls = {"n": 0}

    def loss_fn(model, batch):
        s, a, r, s2, d = batch
        calls["n"] += 1
        if calls["n"] % 10 == 0:
            target.load_state_dict(model.state_dict())
        q = model(s).gather(1, a.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            y = r + D.GAMMA * (1 - d) * target(s2).max(1).values
        return F.mse_loss(q, y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(obs, act, rew, next_obs, done), 64), loss_fn=loss_fn,
                val_loader=D.q_val_loader(), max_steps=300)


class NegSampler(Dataset):
    def __init__(self, pairs, n_users, n_items, fixed):
        self.pairs, self.n_users, self.n_items, self.fixed = pairs, n_users, n_items, fixed

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i):
        u, p = self.pairs[i]
        high = self.n_items if self.fixed else self.n_users    # copied from the user-side sampler
        return u, p, torch.randint(0, high, ()).item()


@case("rec_neg_sampler_wrong_range", "data",
      "The negative sampler draws item ids with randint(0, n_users) instead of randint(0, n_items); with 80 users "
      "and 480 items, five sixths of the catalogue (ids >= 80) is never shown as a negative, so those items are only ever "
      "pushed up and get ranked above every user's real positives; sample from range(n_items).",
      r"n_users|negatives?.{0,60}(range|never|subset|half|quarter|sixth|only ids|upper bound)|"
      r"(never|not) (sampled|drawn|shown) as (a )?negative|randint.{0,30}(n_items|items)|"
      r"sampler.{0,60}(range|subset|n_items)")
def rec_neg_sampler_wrong_range(fixed: bool = False):
    seed(0)
    data = D.Interactions(n_users=80, n_items=480)
    model = D.MF(data.n_users, data.n_items)

    def loss_fn(model, batch):
        u, p, q = batch
        return -F.logsigmoid(model(u, p) - model(u, q)).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(NegSampler(data.train_pairs, data.n_users, data.n_items, fixed), 128),
                loss_fn=loss_fn, val_loader=D.ranking_val_loader(data), max_steps=300)


@case("pinn_collocation_unscaled", "data",
      "The collocation points are drawn with torch.rand(n, 1), i.e. in [0, 1], but the domain is [0, 3]; the PDE "
      "residual is never enforced on (1, 3], where only the boundary point x = 3 constrains the network; scale the "
      "samples to the domain (torch.rand(n, 1) * L).",
      r"collocation.*(domain|range|\[0, ?1\]|scale|cover|half)|(domain|interval).*(not covered|\[0, ?3\]|third|two.?thirds)|"
      r"torch\.rand.*(\* ?L|scale|domain)|(sampl|points?).*(only|never).*(\[0, ?1\]|part of the domain|\(1, ?3\])")
def pinn_collocation_unscaled(fixed: bool = False):
    seed(0)
    length = 3.0
    x = torch.rand(512, 1, generator=gen(0))
    if fixed:
        x = x * length
    model = D.pinn_mlp()

    def loss_fn(model, batch):
        xc = batch[0].clone().requires_grad_(True)
        u = model(xc)
        u_xx = D.d_dx(D.d_dx(u, xc), xc)
        pde = ((u_xx - D.poisson_forcing(xc, length)) ** 2).mean() / (D.PI / length) ** 4
        xb = torch.tensor([[0.0], [length]], device=xc.device)
        return pde + 10 * (model(xb) ** 2).mean()

    xv = torch.linspace(0, length, 201).unsqueeze(1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x), 128), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(xv, D.poisson_exact(xv, length)), 201, shuffle=False),
                max_steps=300)


class FieldDataset(Dataset):
    """Coefficient field a(x) -> solution u(x); the input field is standardised before the model sees it."""

    def __init__(self, a, u, x, stats=None):
        self.a, self.u, self.x, self.stats = a, u, x, stats

    def __len__(self):
        return len(self.a)

    def __getitem__(self, i):
        a = self.a[i]
        mean, std = self.stats if self.stats is not None else (a.mean(), a.std())
        return torch.stack([(a - mean) / std, self.x]), self.u[i]


@case("surrogate_per_sample_norm", "data",
      "The Dataset standardises each input field with its own mean and std ((a - a.mean()) / a.std() per sample), "
      "which erases the field's amplitude and offset that the solution u scales with, so inputs of different "
      "magnitude look identical; normalise with statistics computed once over the training set.",
      r"per.?sample|(own|each (sample|field)'?s?) (mean|std|statistics)|instance.?norm|"
      r"(amplitude|magnitude|scale|offset).*(erased|lost|removed|discard)|(global|dataset|training.?set) "
      r"(statistics|mean|std)")
def surrogate_per_sample_norm(fixed: bool = False):
    seed(0)
    a, u, x = D.elliptic_pairs(1200, s=9)
    stats = (a[:1000].mean(), a[:1000].std()) if fixed else None
    model = D.conv_surrogate(2, 1)
    model.append(nn.Flatten())
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(FieldDataset(a[:1000], u[:1000], x, stats), 32), loss_fn=nn.MSELoss(),
                val_loader=loader(FieldDataset(a[1000:], u[1000:], x, stats), 100, shuffle=False), max_steps=300)
