"""Small forecasting / anomaly models shared by set bj's cases."""

from __future__ import annotations

import torch
from torch import nn


class GRUForecaster(nn.Module):
    """GRU over a window (B, L) or (B, L, F) -> horizon (B, H) from the output at time index ``idx``."""

    def __init__(self, H: int, inp: int = 1, hid: int = 32, batch_first: bool = True, idx: int = -1, heads=None):
        super().__init__()
        self.gru = nn.GRU(inp, hid, batch_first=batch_first)
        self.head = nn.Linear(hid, H) if heads is None else None
        self.heads = heads
        self.idx = idx

    def forward(self, x):
        if x.dim() == 2:
            x = x.unsqueeze(-1)
        out, _ = self.gru(x)
        z = out[:, self.idx]
        if self.heads is not None:
            return torch.cat([h(z) for h in self.heads], dim=1)
        return self.head(z)


class Seq2Seq(nn.Module):
    """GRU encoder-decoder. forward(x): autoregressive horizon (B, H); teacher(x, dec_in): teacher-forced (B, H)."""

    def __init__(self, H: int, hid: int = 32, carry_hidden: bool = True):
        super().__init__()
        self.H = H
        self.enc = nn.GRU(1, hid, batch_first=True)
        self.dec = nn.GRU(1, hid, batch_first=True)
        self.out = nn.Linear(hid, 1)
        self.carry_hidden = carry_hidden

    def teacher(self, x, dec_in):
        _, h = self.enc(x.unsqueeze(-1))
        o, _ = self.dec(dec_in.unsqueeze(-1), h)
        return self.out(o).squeeze(-1)

    def forward(self, x):
        _, h = self.enc(x.unsqueeze(-1))
        inp, preds = x[:, -1:].unsqueeze(-1), []
        for _ in range(self.H):
            o, h_new = self.dec(inp, h) if self.carry_hidden else self.dec(inp)
            h = h_new
            p = self.out(o)
            preds.append(p.squeeze(-1))
            inp = p
        return torch.cat(preds, dim=1)


class WindowAE(nn.Module):
    """Bottleneck autoencoder on windows (B, L); ``residual`` adds the input back to the reconstruction."""

    def __init__(self, L: int, z: int = 3, residual: bool = False):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(L, 32), nn.ReLU(), nn.Linear(32, z))
        self.dec = nn.Sequential(nn.Linear(z, 32), nn.ReLU(), nn.Linear(32, L))
        self.residual = residual

    def forward(self, x):
        r = self.dec(self.enc(x))
        return x + r if self.residual else r
