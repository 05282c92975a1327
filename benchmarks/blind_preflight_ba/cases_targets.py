"""Targets: TD, return-to-go, advantage and contrastive targets that are computed wrongly."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ba.registry import (
    BC_ACTIONS,
    BC_DIM,
    Q_ACTIONS,
    Q_DIM,
    Q_GAMMA,
    TinyClip,
    case,
    clip_val_loader,
    decisions_val_loader,
    gen,
    loader,
    logged_decisions,
    mlp,
    pairs,
    q_transitions,
    q_val_loader,
    rollout_world,
    rtg,
    rtg_val_loader,
    seed,
)


@case("fqe_bootstraps_through_terminals", "targets",
      "the TD target r + gamma * max_a Q_target(s', a) ignores the done flag, so terminal transitions bootstrap from "
      "the unrelated next state logged after the episode ended and the Q values are inflated",
      r"done|terminal|(1 ?- ?d)|not[ _]done|bootstrap|episode (end|boundar)|absorbing")
def fqe_bootstraps_through_terminals(fixed: bool = False):
    seed(0)
    x, a, r, x2, term, _ = q_transitions(3000)
    qnet = mlp(Q_DIM, Q_ACTIONS)
    target_net = copy.deepcopy(qnet).requires_grad_(False)
    calls = [0]

    def td_loss(model, batch):
        s, act, rew, s2, done = batch
        calls[0] += 1
        if calls[0] % 20 == 0:
            target_net.load_state_dict(model.state_dict())
        q = model(s).gather(1, act[:, None]).squeeze(1)
        with torch.no_grad():
            nxt = target_net(s2).max(1).values
            y = rew + Q_GAMMA * (1 - done) * nxt if fixed else rew + Q_GAMMA * nxt
        return nn.functional.mse_loss(q, y)

    return dict(model=qnet, optimizer=torch.optim.Adam(qnet.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, a, r, x2, term), batch_size=64), loss_fn=td_loss,
                val_loader=q_val_loader(), max_steps=300)


@case("rtg_discount_from_episode_start", "targets",
      "the discounted return-to-go weights reward k by gamma**k counted from the start of the episode instead of "
      "gamma**(k - t) from the current step, so later steps get value targets shrunk by gamma**t",
      r"gamma\s*\*\*\s*\(?k|gamma\s*\*\*\s*\(?t|gamma\^|from the (start|beginning) of the episode|"
      r"discount.*(start|beginning|absolute|current step|relative)|(relative|current) step|"
      r"return.to.go.*(discount|shrunk|wrong)|exponent")
def rtg_discount_from_episode_start(fixed: bool = False):
    seed(0)
    obs, t, rewards = rollout_world(120, 20)
    if fixed:
        returns = rtg(rewards)
    else:
        disc = 0.9 ** torch.arange(20).float()
        returns = torch.flip(torch.cumsum(torch.flip(rewards * disc, [1]), 1), [1])
    x = torch.cat([obs, t], -1).reshape(-1, 5)
    value = mlp(5, 1)
    return dict(model=value, optimizer=torch.optim.Adam(value.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, returns.reshape(-1, 1)), batch_size=64), loss_fn=nn.MSELoss(),
                val_loader=rtg_val_loader(), max_steps=300)


def flat_buffer(s=0):
    """Episodes of random length 4..16 concatenated in one logged buffer with a done flag on each last step."""
    g = gen(800 + s)
    lengths = torch.randint(4, 17, (300,), generator=g).tolist()
    obs, t, rewards = rollout_world(300, 16, s=s)
    rows, rew, done = [], [], []
    for e, n in enumerate(lengths):
        tt = torch.arange(n).float()[:, None]
        rows.append(torch.cat([obs[e, :n], (n - 1 - tt) / 16], 1))  # time left in the episode
        rew.append(rewards[e, :n])
        done.append(torch.zeros(n).index_fill_(0, torch.tensor([n - 1]), 1.0))
    return torch.cat(rows), torch.cat(rew), torch.cat(done)


def buffer_returns(rew, done, reset=True):
    out, run = torch.zeros_like(rew), 0.0
    for i in range(len(rew) - 1, -1, -1):
        if reset:
            run = rew[i] + 0.9 * run * (1 - done[i])
        else:
            run = rew[i] + 0.9 * run
        out[i] = run
    return out


@case("returns_leak_across_episode_boundaries", "targets",
      "the discounted returns are accumulated backwards over the flat logged buffer without resetting at done, so "
      "the last steps of every episode get the next episode's return added to their value targets",
      r"done|episode (boundar|end)|reset|across episodes|(1 ?- ?d)|terminal|next episode")
def returns_leak_across_episode_boundaries(fixed: bool = False):
    seed(0)
    x, rew, done = flat_buffer(0)
    y = buffer_returns(rew, done, reset=fixed)
    xv, rv, dv = flat_buffer(99)
    yv = buffer_returns(rv, dv)
    value = mlp(5, 1)
    return dict(model=value, optimizer=torch.optim.Adam(value.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y[:, None]), batch_size=64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(xv, yv), batch_size=500, shuffle=False), max_steps=300)


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(BC_DIM, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.pi = nn.Linear(64, BC_ACTIONS)
        self.v = nn.Linear(64, 1)

    def forward(self, x):
        return self.pi(self.trunk(x))

    def value(self, x):
        return self.v(self.trunk(x)).squeeze(-1)


@case("awr_advantage_sign_flipped", "targets",
      "the advantage is computed as V(s) - R instead of R - V(s), so exp(advantage / beta) up-weights the worst "
      "logged actions and advantage-weighted regression imitates them",
      r"sign|V\(s\) ?- ?R|R ?- ?V|return minus (the )?value|negat|flipped|reversed|(worst|bad) actions|"
      r"advantage.*(wrong|invert|backward)")
def awr_advantage_sign_flipped(fixed: bool = False):
    seed(0)
    x, a, r, _ = logged_decisions(3000)
    model = ActorCritic()

    def awr_loss(m, batch):
        s, act, ret = batch
        v = m.value(s)
        adv = (ret - v.detach()) if fixed else (v.detach() - ret)
        w = torch.exp(adv / 0.5).clamp(max=20.0)
        logp = torch.log_softmax(m(s), -1).gather(1, act[:, None]).squeeze(1)
        return -(w * logp).mean() + 0.5 * nn.functional.mse_loss(v, ret)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, a, r), batch_size=64), loss_fn=awr_loss,
                val_loader=decisions_val_loader(), max_steps=300)


@case("clip_targets_are_class_ids", "targets",
      "the contrastive loss uses each pair's class label as the target for the (B, B) similarity logits instead of "
      "torch.arange(B), so image i is pushed toward caption number y_i of the batch rather than its own caption",
      r"arange|diagonal|matching pair|(own|its) (caption|pair|text)|index of (the|its) pair|class (label|id)s?.*"
      r"(target|logit)|targets? (should|must) be (the )?(position|index)|positive pair")
def clip_targets_are_class_ids(fixed: bool = False):
    seed(0)
    img, cap, cls = pairs(2000)
    model = TinyClip()

    def loss_fn(m, batch):
        im, tx, y = batch
        logits = m(im, tx)
        target = torch.arange(len(im), device=logits.device) if fixed else y
        return (nn.functional.cross_entropy(logits, target) + nn.functional.cross_entropy(logits.T, target)) / 2

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(img, cap, cls), batch_size=64, drop_last=True), loss_fn=loss_fn,
                val_loader=clip_val_loader(), max_steps=300)
