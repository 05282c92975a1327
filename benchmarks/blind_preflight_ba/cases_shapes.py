"""Shapes: behavioural cloning, fitted-Q and return-to-go setups whose tensors line up wrongly without an error."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ba.registry import (
    Q_ACTIONS,
    Q_DIM,
    Q_GAMMA,
    case,
    gen,
    loader,
    mlp,
    q_transitions,
    q_val_loader,
    rollout_world,
    rtg,
    rtg_val_loader,
    seed,
)


def steering_demos(n, s):
    g = gen(31)
    w = torch.randn(10, generator=g) / 10 ** 0.5
    g = gen(500 + s)
    x = torch.randn(n, 10, generator=g)
    return x, 2 * torch.tanh(2 * (x @ w)) + 0.05 * torch.randn(n, generator=g)


@case("bc_steering_mse_broadcast", "shapes",
      "the policy outputs steering of shape (B, 1) while the logged actions are (B,): nn.MSELoss broadcasts them to "
      "(B, B) and regresses every prediction onto every action in the batch (the mean action)",
      r"\(B, ?1\)|\(N, ?1\)|\(B, ?B\)|\(N, ?N\)|\(64, ?1\)|\(64, ?64\)|\[64, ?1\]|\[64, ?64\]|target size .*"
      r"different|unsqueeze\(-?1\) (the )?(target|action)|actions?\[:, ?None\]|(target|action)s?.{0,40}(resh"
      r"ape|view)\(-1, ?1\)")
def bc_steering_mse_broadcast(fixed: bool = False):
    seed(0)
    x, a = steering_demos(2000, 0)
    xv, av = steering_demos(500, 99)
    if fixed:
        a, av = a[:, None], av[:, None]
    policy = mlp(10, 1)
    return dict(model=policy, optimizer=torch.optim.Adam(policy.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, a), batch_size=64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(xv, av), batch_size=250, shuffle=False), max_steps=300)


@case("fqe_td_target_broadcast", "shapes",
      "Q(s, a) picked with gather(1, a.unsqueeze(1)) is (B, 1) while the TD target r + gamma * max Q'(s') is (B,): "
      "F.smooth_l1_loss broadcasts to (B, B), so every Q value is fitted to every target in the batch",
      r"\(B, ?1\)|\(N, ?1\)|\(B, ?B\)|\(N, ?N\)|\(64, ?1\)|\(64, ?64\)|\[64, ?1\]|\[64, ?64\]|target size .*"
      r"different|gather\(.*\).*squeeze|squeeze\(1\) (after|on) (the )?gather|TD target.{0,40}(shape|broadca"
      r"st)")
def fqe_td_target_broadcast(fixed: bool = False):
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
        q = model(s).gather(1, act.unsqueeze(1))
        if fixed:
            q = q.squeeze(1)
        with torch.no_grad():
            y = rew + Q_GAMMA * (1 - done) * target_net(s2).max(1).values
        return nn.functional.smooth_l1_loss(q, y)

    return dict(model=qnet, optimizer=torch.optim.Adam(qnet.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, a, r, x2, term), batch_size=64), loss_fn=td_loss,
                val_loader=q_val_loader(), max_steps=300)


@case("rtg_discounted_sum_over_batch_axis", "shapes",
      "the rewards are laid out (episodes, time) but the discounted return-to-go is accumulated backwards over dim 0, "
      "the episode axis, so each step's value target sums rewards of other episodes instead of its own future",
      r"dim(ension)?\s*=?\s*0|axis\s*=?\s*0|wrong (dim|axis)|episode axis|batch (axis|dim)|over (the )?episodes|"
      r"time (axis|dim)|dim\s*=?\s*1|dim\s*=?\s*-1|transpos|return.to.go|returns?.*(other|different) episodes")
def rtg_discounted_sum_over_batch_axis(fixed: bool = False):
    seed(0)
    obs, t, rewards = rollout_world(120, 20)
    if fixed:
        returns = rtg(rewards)
    else:  # (E, T): walk the first axis backwards
        returns = torch.zeros_like(rewards)
        run = torch.zeros(rewards.shape[1])
        for i in range(rewards.shape[0] - 1, -1, -1):
            run = rewards[i] + 0.9 * run
            returns[i] = run
    x = torch.cat([obs, t], -1).reshape(-1, 5)
    value = mlp(5, 1)
    return dict(model=value, optimizer=torch.optim.Adam(value.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, returns.reshape(-1, 1)), batch_size=64), loss_fn=nn.MSELoss(),
                val_loader=rtg_val_loader(), max_steps=300)


def camera_frames(n, s):
    """Channels-last 8x8 RGB frames (as a camera driver stores them) with a caption token; the label is the quadrant
    holding a red blob, the caption says whether the blob or a green decoy is the one to report."""
    g = gen(600 + s)
    img = 0.2 * torch.rand(n, 8, 8, 3, generator=g)
    quad = torch.randint(0, 4, (n,), generator=g)
    decoy = torch.randint(0, 4, (n,), generator=g)
    which = torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        r0, c0 = 4 * (quad[i] // 2), 4 * (quad[i] % 2)
        img[i, r0:r0 + 3, c0:c0 + 3, 0] += 1.0
        r1, c1 = 4 * (decoy[i] // 2), 4 * (decoy[i] % 2)
        img[i, r1:r1 + 3, c1:c1 + 3, 1] += 1.0
    y = torch.where(which == 0, quad, decoy)
    return img, which, y


class FrameCaptionNet(nn.Module):
    def __init__(self, channels_last_fix: bool):
        super().__init__()
        self.fix = channels_last_fix
        self.conv = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                  nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.tok = nn.Embedding(2, 16)
        self.head = nn.Sequential(nn.Linear(64 + 16, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, batch):
        img, tok = batch
        if self.fix:
            img = img.permute(0, 3, 1, 2)
        else:  # "make it NCHW"
            img = img.reshape(img.shape[0], 3, 8, 8)
        return self.head(torch.cat([self.conv(img), self.tok(tok)], 1))


@case("frames_hwc_reshaped_to_chw", "shapes",
      "channels-last camera frames (N, H, W, C) are turned into NCHW with reshape instead of permute(0, 3, 1, 2), "
      "which scrambles pixels and colour channels before the conv encoder",
      r"permute|NHWC|\bHWC\b|\(N, ?H, ?W, ?C\)|reshape.{0,40}(channel|NCHW|scrambl|interleav)|(view|reshape)"
      r" instead of (permute|transpose)|scrambl|movedim")
def frames_hwc_reshaped_to_chw(fixed: bool = False):
    seed(0)
    img, tok, y = camera_frames(2000, 0)
    iv, tv, yv = camera_frames(500, 99)
    model = FrameCaptionNet(fixed)

    def loss_fn(m, batch):
        return nn.functional.cross_entropy(m(batch[:2]), batch[2])

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(img, tok, y), batch_size=64), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(iv, tv, yv), batch_size=250, shuffle=False), max_steps=300)


def memory_trajectories(n, s, length=12):
    """Logged trajectories where the demonstrator's action at step t is decided by the observation at t - 1."""
    g = gen(700 + s)
    obs = torch.randn(n, length, 6, generator=g)
    w = torch.randn(6, 3, generator=gen(41))
    act = torch.zeros(n, length, dtype=torch.long)
    act[:, 1:] = (obs[:, :-1] @ w).argmax(-1)
    return obs, act


class TrajectoryTransformer(nn.Module):
    def __init__(self, fixed, length=12):
        super().__init__()
        self.inp = nn.Linear(6, 32)
        self.pos = nn.Parameter(torch.randn(length, 32) * 0.1)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True) if fixed else \
            nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, 2)
        self.out = nn.Linear(32, 3)

    def forward(self, obs):  # obs: (batch, time, features)
        return self.out(self.enc(self.inp(obs) + self.pos))


@case("bc_transformer_batch_first_default", "shapes",
      "the trajectories are (batch, time, features) but nn.TransformerEncoderLayer defaults to batch_first=False, so "
      "attention runs across the episodes of the batch at each time step instead of along each episode's history",
      r"batch_first|seq(uence)?.first|time.major|\(T, ?B|\(S, ?N|\(B, ?T|transpose\(0, ?1\)|permute\(1, ?0|"
      r"attend(s|ing)? across (the )?(batch|episodes)|(batch|time) (axis|dim).*(swap|confus)")
def bc_transformer_batch_first_default(fixed: bool = False):
    seed(0)
    obs, act = memory_trajectories(1500, 0)
    ov, av = memory_trajectories(300, 99)
    model = TrajectoryTransformer(fixed)

    def loss_fn(m, batch):
        logits = m(batch[0])
        return nn.functional.cross_entropy(logits[:, 1:].reshape(-1, 3), batch[1][:, 1:].reshape(-1))

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(obs, act), batch_size=32), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(ov, av), batch_size=100, shuffle=False), max_steps=300)
