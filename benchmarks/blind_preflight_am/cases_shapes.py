"""Set am, family shapes: tensors whose shapes line up by accident in forecasting, recommendation and tabular code."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_am.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# ---------------------------------------------------------------------------------------------------------------


def sine_windows(n: int, length: int, horizon: int, s: int):
    """Noisy sines of random frequency and phase: `length` past values, the next `horizon` values."""
    g = gen(s)
    w = 0.15 + 0.45 * torch.rand(n, 1, generator=g)
    phase = 2 * math.pi * torch.rand(n, 1, generator=g)
    amp = 0.5 + torch.rand(n, 1, generator=g)
    t = torch.arange(length + horizon).float()
    series = amp * torch.sin(w * t + phase) + 0.05 * torch.randn(n, length + horizon, generator=g)
    return series[:, :length], series[:, length:]


class HorizonGRU(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.gru = nn.GRU(1, 32, batch_first=True)
        self.head = nn.Linear(32, 6)

    def forward(self, x):                                 # x: (batch, 24, 1)
        out, _ = self.gru(x)
        pred = self.head(out[:, -1:])                     # (batch, 1, 6): the time axis kept by the -1: slice
        return pred.transpose(1, 2) if self.fixed else pred


@case("am_horizon_target_extra_dim", "shapes",
      "A multi-horizon GRU forecaster keeps the time axis with out[:, -1:] and outputs (batch, 1, 6) while the targets "
      "were stacked like the inputs as (batch, 6, 1); nn.MSELoss broadcasts them to (batch, 6, 6), so every horizon "
      "output is fitted to all six future values and the model learns the horizon mean.",
      r"(\(\s*\w*,?\s*1\s*,\s*6\s*\)|\(\s*\w*,?\s*6\s*,\s*1\s*\)|\[\s*\w*,?\s*(1\s*,\s*6|6\s*,\s*1)\s*\]|6\s*,\s*6\b|"
      r"-1:|broadcast\w*.{0,80}(horizon|all (six|6|the) (future|target)|each other)|(horizon|forecast).{0,80}broadcast)")
def horizon_target_extra_dim(fixed: bool = False):
    seed(0)
    x, y = sine_windows(2400, 24, 6, 1)
    x, y = x.unsqueeze(-1), y.unsqueeze(-1)              # (N, 24, 1) and (N, 6, 1): "same layout as the inputs"
    model = HorizonGRU(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=600)


fix("am_horizon_target_extra_dim", fixed_of(horizon_target_extra_dim),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE over the 6 horizons", higher=False)

# ---------------------------------------------------------------------------------------------------------------


def ramp_windows(n: int, s: int):
    """(n, 32, 4) sensor windows; feature 0 carries a 3-step rising (class 1) or falling (class 0) ramp."""
    g = gen(s)
    x = 0.3 * torch.randn(n, 32, 4, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    pos = torch.randint(0, 29, (n,), generator=g)
    ramp = torch.tensor([-1.5, 0.0, 1.5])
    for i in range(n):
        x[i, pos[i]:pos[i] + 3, 0] += ramp if y[i] == 1 else -ramp
    return x, y


class RampCNN(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.conv = nn.Conv1d(4, 16, kernel_size=3, padding=1)
        self.head = nn.Linear(16, 2)

    def forward(self, x):                                 # x: (batch, time, features) as the CSV rows come
        b, t, f = x.shape
        x = x.permute(0, 2, 1) if self.fixed else x.view(b, f, t)
        h = torch.relu(self.conv(x)).amax(dim=-1)
        return self.head(h)


@case("am_conv1d_view_not_permute", "shapes",
      "Sensor windows come as (batch, time, features) and are turned into Conv1d's (batch, channels, length) with "
      "x.view(b, f, t) instead of x.permute(0, 2, 1), which reinterprets the memory: each 'channel' holds 8 "
      "consecutive time steps of all features interleaved, so the convolution never sees consecutive steps of a "
      "feature.",
      r"((Conv1d|\(\s*batch,\s*channels?,\s*length\s*\)|\(N,\s*C,\s*L\)|channels.first).{0,160}(view|reshape|permute|"
      r"transpose)|(view|reshape|permute|transpose)\w*.{0,160}(Conv1d|\(\s*batch,\s*channels?,\s*length|\(N,\s*C,\s*L\))|"
      r"(view|reshape)\w*.{0,60}(scrambl|interleav|reinterpret)\w*.{0,60}(channel|time|feature))")
def conv1d_view_not_permute(fixed: bool = False):
    seed(0)
    x, y = ramp_windows(2400, 2)
    model = RampCNN(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("am_conv1d_view_not_permute", fixed_of(conv1d_view_not_permute),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")

# ---------------------------------------------------------------------------------------------------------------


def mf_ratings(n_users: int, n_items: int, n: int, rank: int, s: int):
    g = gen(s)
    pu, qi = torch.randn(n_users, rank, generator=g), torch.randn(n_items, rank, generator=g)
    bu, bi = 0.3 * torch.randn(n_users, generator=g), 0.3 * torch.randn(n_items, generator=g)
    u = torch.randint(0, n_users, (n,), generator=g)
    i = torch.randint(0, n_items, (n,), generator=g)
    r = 3.5 + bu[u] + bi[i] + (pu[u] * qi[i]).sum(1) / rank ** 0.5 + 0.1 * torch.randn(n, generator=g)
    return torch.stack([u, i], 1), r


class BiasedMF(nn.Module):
    def __init__(self, n_users, n_items, dim, fixed):
        super().__init__()
        self.fixed = fixed
        self.user, self.item = nn.Embedding(n_users, dim), nn.Embedding(n_items, dim)
        self.user_bias, self.item_bias = nn.Embedding(n_users, 1), nn.Embedding(n_items, 1)
        self.mu = nn.Parameter(torch.tensor(3.5))
        for e in (self.user, self.item):
            nn.init.normal_(e.weight, std=0.3)
        for e in (self.user_bias, self.item_bias):
            nn.init.zeros_(e.weight)

    def forward(self, x):
        u, i = x[:, 0], x[:, 1]
        dot = (self.user(u) * self.item(i)).sum(dim=1) if self.fixed else (self.user(u) * self.item(i)).sum()
        return dot + self.user_bias(u).squeeze(-1) + self.item_bias(i).squeeze(-1) + self.mu


@case("am_mf_dot_sum_no_dim", "shapes",
      "A biased matrix-factorisation model computes the user-item interaction as (user_vec * item_vec).sum() with no "
      "dim, a single scalar summed over the whole batch that broadcasts onto the (batch,) biases: every rating in a "
      "batch gets the same interaction term and only the user/item biases can fit.",
      r"(\.sum\(\s*\)|sum\(\)|sum (over|across) the (whole |entire )?batch|without (a |the )?dim|no dim\b|"
      r"sum\(\s*(dim\s*=\s*)?(1|-1)\s*\)|(dot|interaction|inner product).{0,80}(scalar|0-d|zero-dim)|"
      r"(scalar|0-d|zero-dim).{0,80}(dot|interaction|inner product))")
def mf_dot_sum_no_dim(fixed: bool = False):
    seed(0)
    x, r = mf_ratings(300, 200, 12000, 4, 3)
    model = BiasedMF(300, 200, 8, fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=loader(TensorDataset(x[:10000], r[:10000]), 128),
                val_loader=loader(TensorDataset(x[10000:], r[10000:]), 500, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=800)


fix("am_mf_dot_sum_no_dim", fixed_of(mf_dot_sum_no_dim), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False, steps=400)

# ---------------------------------------------------------------------------------------------------------------


def sign_sequences(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 20, 3, generator=g)
    drift = torch.randn(n, 1, generator=g) * 0.4
    x[:, :, 0] += drift
    y = (x[:, :, 0].mean(1) > 0).long()
    return x, y


class SessionGRU(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.gru = nn.GRU(3, 24, num_layers=2, batch_first=True)
        self.head = nn.Linear(48, 2)

    def forward(self, x):
        _, h_n = self.gru(x)                              # h_n: (num_layers, batch, hidden), batch_first or not
        b = x.shape[0]
        h = h_n.permute(1, 0, 2).reshape(b, -1) if self.fixed else h_n.view(b, -1)
        return self.head(h)


@case("am_gru_hn_view_mixes_batch", "shapes",
      "The two-layer GRU's final state h_n has shape (num_layers, batch, hidden) even with batch_first=True; "
      "h_n.view(batch, -1) flattens it layer-major, so row b holds the states of samples 2b and 2b+1 of one layer and "
      "the classifier scores the wrong samples.",
      r"(h_n|hidden state|final state|h_?n\b).{0,160}(num_layers|layer.major|\(num_layers, ?batch|permute|transpose|"
      r"view|mix\w* (samples|batch))|(num_layers, ?batch|layer.major).{0,120}(view|reshape|batch)|"
      r"(permute|transpose)\(\s*1\s*,\s*0")
def gru_hn_view_mixes_batch(fixed: bool = False):
    seed(0)
    x, y = sign_sequences(2400, 4)
    model = SessionGRU(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("am_gru_hn_view_mixes_batch", fixed_of(gru_hn_view_mixes_batch),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")

# ---------------------------------------------------------------------------------------------------------------


def window_means(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 16, 3, generator=g)
    level = torch.randn(n, 1, generator=g)
    x[:, :, 0] = x[:, :, 0] * 0.5 + level
    y = x[:, :, 0].mean(1) + 0.5 * x[:, :, 1].mean(1)
    return x, y


class LoadLSTM(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.lstm = nn.LSTM(3, 32, batch_first=fixed)
        self.head = nn.Linear(32, 1)

    def forward(self, x):                                 # x: (batch, time, features)
        out, _ = self.lstm(x)
        return self.head(out[:, -1]).squeeze(-1)


@case("am_lstm_window_seq_first", "shapes",
      "(batch, time, features) load windows are fed to an nn.LSTM built without batch_first=True, so it reads the "
      "batch axis as time: out[:, -1] is the last window's step recurrently mixed over the samples of the batch, not "
      "each window's last step.",
      r"((without|missing|forg\w+|add|pass|set|no) (the )?batch_first|batch_first(=True)? (is |was )?(not set|missing|False)|"
      r"batch_first\s*=\s*False|\(seq(_len)?, ?batch|seq.first|time.major|(batch|sample)\w* (axis|dim\w*) (is )?(read|"
      r"treated|interpreted|used) as (the )?(time|sequence)|(recur\w*|mix\w*) (over|across) (the )?samples)")
def lstm_window_seq_first(fixed: bool = False):
    seed(0)
    x, y = window_means(2400, 5)
    model = LoadLSTM(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=600)


fix("am_lstm_window_seq_first", fixed_of(lstm_window_seq_first), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False)
