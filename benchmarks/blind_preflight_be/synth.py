"""Synthetic data and small pretrained teachers for set be (seeded, CPU, nothing downloaded)."""

from __future__ import annotations

import functools

import torch
from torch import nn

from benchmarks.blind_preflight.registry import gen


def blobs(n: int, d: int, c: int, s: int = 0):
    """Nonlinear but learnable classes: a random 2-layer teacher's argmax."""
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w1 = torch.randn(d, 32, generator=g) / d ** 0.5
    w2 = torch.randn(32, c, generator=g)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def mlp(d, h, c):
    return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, c))


@functools.cache
def _teacher_state(n, d, c, s, h, steps):
    torch.manual_seed(s + 99)
    x, y = blobs(n, d, c, s)
    t = mlp(d, h, c)
    opt = torch.optim.Adam(t.parameters(), lr=3e-3)
    for i in range(steps):
        idx = torch.randint(0, n, (128,), generator=gen(s * 1000 + i))
        loss = nn.functional.cross_entropy(t(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.clone() for k, v in t.state_dict().items()}


def teacher(n, d, c, s=0, h=128, steps=400):
    """A trained teacher MLP for blobs(n, d, c, s), in eval mode and frozen."""
    t = mlp(d, h, c)
    t.load_state_dict(_teacher_state(n, d, c, s, h, steps))
    t.eval()
    t.requires_grad_(False)
    return t


def split(x, y, n_train):
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])
