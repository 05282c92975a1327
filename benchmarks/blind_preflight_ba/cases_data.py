"""Data: the logged trajectories or the paired modalities reach the model mis-assembled."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ba.cases_targets import buffer_returns, flat_buffer
from benchmarks.blind_preflight_ba.registry import (
    Q_ACTIONS,
    Q_DIM,
    Q_GAMMA,
    TinyClip,
    case,
    clip_loss,
    clip_val_loader,
    gen,
    loader,
    mlp,
    pairs,
    q_transitions,
    q_val_loader,
    seed,
)


@case("returns_computed_after_shuffling_buffer", "data",
      "the logged buffer is shuffled (np.random.permutation) before the discounted returns are computed by scanning it "
      "backwards, so each return sums rewards of unrelated transitions instead of the following steps of its episode",
      r"shuffl\w* (the )?(buffer|transitions|data|rows|dataset|log).{0,30}before|before (computing|the) (dis"
      r"counted )?returns|permut\w*.{0,30}before|returns.{0,40}(after|from|on) (a |the )?(shuffl|permut)|tem"
      r"poral order|episode order|consecutive|unrelated (rewards|transitions)|order of (the )?(steps|transit"
      r"ions)")
def returns_computed_after_shuffling_buffer(fixed: bool = False):
    seed(0)
    x, rew, done = flat_buffer(0)
    if fixed:
        y = buffer_returns(rew, done)
        perm = torch.randperm(len(x), generator=gen(5))
        x, y = x[perm], y[perm]
    else:
        perm = torch.randperm(len(x), generator=gen(5))
        x, rew, done = x[perm], rew[perm], done[perm]
        y = buffer_returns(rew, done)
    xv, rv, dv = flat_buffer(99)
    value = mlp(5, 1)
    return dict(model=value, optimizer=torch.optim.Adam(value.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y[:, None]), batch_size=64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(xv, buffer_returns(rv, dv)), batch_size=500, shuffle=False),
                max_steps=300)


CHUNK = 8


def reach_chunks(n, s):
    """Observation -> the next 8 joint targets (an action chunk) of a reaching demonstrator, in raw units."""
    g = gen(1100 + s)
    x = torch.randn(n, 6, generator=g)
    w = torch.randn(6, 2, generator=gen(81))
    start, goal = x @ w, 3 * torch.tanh(x @ w.flip(1))
    frac = torch.linspace(0, 1, CHUNK)
    chunk = start[:, None, :] + frac[None, :, None] * (goal - start)[:, None, :]
    return x, 5.0 + 10.0 * chunk.reshape(n, -1)


class ChunkPolicy(nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        self.net = mlp(6, 2 * CHUNK, hidden=128)
        self.register_buffer("a_mean", mean)
        self.register_buffer("a_std", std)

    def forward(self, x):  # normalised actions
        return self.net(x)

    def act(self, x):
        return self.net(x) * self.a_std + self.a_mean


@case("bc_action_chunks_normalised_per_chunk", "data",
      "each action chunk is min-max normalised with its own min and max instead of dataset statistics, so the targets "
      "lose their offset and scale and the dataset-statistics un-normalisation at inference cannot invert it",
      r"per.?(chunk|sample|batch|episode)|its own (min|max|stat)|dataset.?(wide )?stat|global (stat|mean|min)|"
      r"normali[sz]\w*.*(inconsistent|invert|statistic)|un.?normali[sz]|denormali[sz]|min.?max")
def bc_action_chunks_normalised_per_chunk(fixed: bool = False):
    seed(0)
    x, chunks = reach_chunks(2000, 0)
    xv, cv = reach_chunks(500, 99)
    mean, std = chunks.mean(0), chunks.std(0)
    if fixed:
        target = (chunks - mean) / std
    else:
        lo, hi = chunks.min(1, keepdim=True).values, chunks.max(1, keepdim=True).values
        target = 2 * (chunks - lo) / (hi - lo + 1e-6) - 1
    policy = ChunkPolicy(mean, std)
    return dict(model=policy, optimizer=torch.optim.Adam(policy.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, target), batch_size=64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(xv, cv), batch_size=250, shuffle=False), max_steps=300)


def driving_log(n_episodes, s, length=25):
    g = gen(1200 + s)
    w = torch.randn(8, 5, generator=gen(91))
    obs = torch.randn(n_episodes, length, 8, generator=g)
    return obs, (obs @ w).argmax(-1)


@case("bc_obs_action_off_by_one", "data",
      "the (observation, action) pairs are built as obs[:, :-1] with actions[:, 1:], so each observation is paired with "
      "the action taken at the next step instead of the action taken in that observation",
      r"off.?by.?one|shift|misalign|next (step|action)|\[:, ?1:\]|\[1:\]|align|same (time ?)?step|lag")
def bc_obs_action_off_by_one(fixed: bool = False):
    seed(0)
    obs, act = driving_log(120, 0)
    ov, av = driving_log(30, 99)
    if fixed:
        x, y = obs.reshape(-1, 8), act.reshape(-1)
    else:
        x, y = obs[:, :-1].reshape(-1, 8), act[:, 1:].reshape(-1)
    policy = mlp(8, 5)
    return dict(model=policy, optimizer=torch.optim.Adam(policy.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, y), batch_size=64), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(ov.reshape(-1, 8), av.reshape(-1)), batch_size=250, shuffle=False),
                max_steps=300)


@case("clip_captions_in_different_order", "data",
      "the captions are read in a different order from the images (sorted by caption text rather than by image id) "
      "and paired by position, so the image-caption pairs the contrastive loss treats as matching are mismatched",
      r"(image|caption|text)s?.{0,40}(pair|order|align)|pairs? (are |is )?(mis|wrong|not)|misalign|mismatche"
      r"d (pair|caption)|sort(ed)? (by|differently)|different order|correspond|(wrong|another|other) (image'"
      r"?s? )?caption")
def clip_captions_in_different_order(fixed: bool = False):
    seed(0)
    img, cap, cls = pairs(2000)
    if not fixed:  # captions.csv sorted by text, images by id
        key = cap[:, 0] * VOCAB_SQ + cap[:, 1] * 24 + cap[:, 2]
        cap = cap[torch.argsort(key)]
    model = TinyClip()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(img, cap, cls), batch_size=64, drop_last=True), loss_fn=clip_loss,
                val_loader=clip_val_loader(), max_steps=300)


VOCAB_SQ = 24 * 24


@case("fqe_timeouts_treated_as_terminals", "data",
      "the done flag is built as terminals | timeouts, so transitions cut by the logging time limit are treated as "
      "terminal and their TD target drops the bootstrap gamma * max Q(s') it should keep",
      r"timeout|time.?limit|truncat|terminals? ?\| ?timeouts?|terminal.*(vs|versus|not|and).*(timeout|truncat)|"
      r"bootstrap")
def fqe_timeouts_treated_as_terminals(fixed: bool = False):
    seed(0)
    x, a, r, x2, term, tout = q_transitions(3000, timeouts=0.5)
    done = term if fixed else torch.clamp(term + tout, max=1.0)
    qnet = mlp(Q_DIM, Q_ACTIONS)
    target_net = copy.deepcopy(qnet).requires_grad_(False)
    calls = [0]

    def td_loss(model, batch):
        s, act, rew, s2, d = batch
        calls[0] += 1
        if calls[0] % 20 == 0:
            target_net.load_state_dict(model.state_dict())
        q = model(s).gather(1, act[:, None]).squeeze(1)
        with torch.no_grad():
            y = rew + Q_GAMMA * (1 - d) * target_net(s2).max(1).values
        return nn.functional.mse_loss(q, y)

    return dict(model=qnet, optimizer=torch.optim.Adam(qnet.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, a, r, x2, done), batch_size=64), loss_fn=td_loss,
                val_loader=q_val_loader(), max_steps=300)
