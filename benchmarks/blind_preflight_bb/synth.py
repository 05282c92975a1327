"""Synthesised, seeded audio and session data shared by set bb's cases."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_bb.registry import gen, loader

SR = 8000
N_FFT, HOP, BANDS = 256, 128, 32


def tone_clips(n, n_cls, s, length=3968, src_sr=SR, base=500.0, step=250.0, noise=0.3):
    """Waveforms (n, length) of one tone per clip, its frequency set by the class; src_sr: the rate the clip was
    recorded at (its samples are spaced 1/src_sr apart)."""
    g = gen(s)
    y = torch.randint(0, n_cls, (n,), generator=g)
    f = base + step * y.float() + 15 * torch.randn(n, generator=g)
    t = torch.arange(length).float() / src_sr
    phase = 2 * math.pi * torch.rand(n, 1, generator=g)
    amp = 0.5 + torch.rand(n, 1, generator=g)
    wav = amp * torch.sin(2 * math.pi * f[:, None] * t + phase) + noise * torch.randn(n, length, generator=g)
    return wav, y


def log_spec(wav):
    """(B, L) waveforms -> (B, BANDS, frames) log band energies (4 FFT bins a band), on the waveform's device."""
    win = torch.hann_window(N_FFT, device=wav.device)
    spec = torch.stft(wav, N_FFT, HOP, window=win, return_complex=True).abs() ** 2
    bands = spec[:, : BANDS * 4].reshape(wav.shape[0], BANDS, 4, -1).mean(2)
    return torch.log(bands + 1e-4)


def decimate2(wav):
    """16 kHz -> 8 kHz: a two-tap low-pass then every other sample (a crude Resample(16000, 8000))."""
    return F.avg_pool1d(wav[:, None], 2)[:, 0]


def nuisance_mels(n, n_cls, s, frames=16, nuisance=4, level=5.0):
    """Log-mel (n, BANDS, frames): the class tone in band 2 + 2 * class, plus `nuisance` loud interferers in random odd
    bands (the same level): a front end must learn to look at the even bands."""
    g = gen(s)
    y = torch.randint(0, n_cls, (n,), generator=g)
    x = -4 + 0.5 * torch.randn(n, BANDS, frames, generator=g)
    x[torch.arange(n), 2 + 2 * y] += level
    odd = torch.arange(1, BANDS, 2)
    for i in range(n):
        pick = odd[torch.randperm(len(odd), generator=g)[:nuisance]]
        x[i, pick] += level * (0.5 + torch.rand(nuisance, 1, generator=g))
    return x, y


def markov_sessions(n, n_items, length, s, order=1, n_min=None, noise=0.0):
    """Sessions (n, length) of item ids 1..n_items (0 stays free for padding): order 1: next = perm[last];
    order 2: next = table[last, second last]; a fraction `noise` of steps jumps to a random item."""
    g = gen(s)
    perm = torch.randperm(n_items, generator=gen(999)) + 1
    table = torch.randint(1, n_items + 1, (n_items + 1, n_items + 1), generator=gen(998))
    seq = torch.zeros(n, length, dtype=torch.long)
    seq[:, 0] = torch.randint(1, n_items + 1, (n,), generator=g)
    seq[:, 1] = torch.randint(1, n_items + 1, (n,), generator=g)
    for t in range(2 if order == 2 else 1, length):
        nxt = perm[seq[:, t - 1] - 1] if order == 1 else table[seq[:, t - 1], seq[:, t - 2]]
        jump = torch.rand(n, generator=g) < noise
        seq[:, t] = torch.where(jump, torch.randint(1, n_items + 1, (n,), generator=g), nxt)
    return seq


def tensors(*xs, batch_size=64, shuffle=True):
    return loader(TensorDataset(*xs), batch_size=batch_size, shuffle=shuffle)
