"""Shapes: sliding-window targets, channels-first sensor windows, seq-first RNNs, horizon matrices, per-step labels."""

from __future__ import annotations

import math

import torch
from torch import nn

from benchmarks.blind_preflight_az.registry import (
    acc_of,
    accel_stream,
    case,
    fix,
    fixed_of,
    loader,
    rmse_of,
    seasonal_panel,
    seed,
    tds,
    windows,
)


def _panel_windows(w, h, s, n_series=8, length=260):
    panel = seasonal_panel(n_series, length, s)
    xs, ys = zip(*(windows(p, w, h) for p in panel))
    return torch.cat(xs), torch.cat(ys)


@case("shapes_next_step_target_1d", "shapes",
      bug="Next-step forecaster outputs (B, 1) but the targets are (B,): MSELoss broadcasts to (B, B) and every "
          "prediction is pulled to the batch mean.",
      cause_pattern=r"broadcast.{0,80}\(64, ?64\)|\(64, ?1\).{0,80}\(64,?\)|\((B|N|batch), ?1\).{0,60}\((B|N|batch),?\)|"
                    r"\((B|N|batch), ?(B|N|batch)\)|(target|label|y)s? (are|is) (1-?d|one-dimensional|flat|rank.?1)|y\[:, ?0\]|"
                    r"unsqueeze\((1|-1)\) (on |to )?the (target|label)s?|(target|label)s?\.unsqueeze|every (prediction|"
                    r"output).{0,60}(batch mean|all (the )?targets)")
def shapes_next_step_target_1d(fixed: bool = False):
    seed(0)
    x, y = _panel_windows(24, 1, 1)
    xv, yv = _panel_windows(24, 1, 101)
    y = y if fixed else y[:, 0]                    # the bug: (N,) next values against a (B, 1) output
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(tds(x, y), 64), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("shapes_next_step_target_1d", fixed_of(shapes_next_step_target_1d),
    rmse_of(lambda m, b: (m(b[0])[:, 0], b[1][:, 0])), "val RMSE", higher=False)


class HarCNN(nn.Module):
    def __init__(self, n_classes, channels_first_fix):
        super().__init__()
        self.fix = channels_first_fix
        self.net = nn.Sequential(nn.Conv1d(3, 32, 7, padding=3), nn.ReLU(), nn.Conv1d(32, 32, 7, padding=3),
                                 nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, n_classes))

    def forward(self, x):                          # x: (B, T, 3) windows as read from the CSV
        if self.fix:
            x = x.transpose(1, 2)
        else:
            x = x.view(x.size(0), 3, -1)           # the bug: view, not permute: axes and time interleaved
        return self.net(x)


def har_windows(s, w=64, stride=16, length=12000, n_classes=6):
    x, lab = accel_stream(length, n_classes, s, seg=(150, 300))
    starts = torch.arange(0, length - w, stride)
    idx = starts[:, None] + torch.arange(w)
    win, wl = x[idx], lab[idx]
    return win, wl.mode(dim=1).values


@case("shapes_har_view_not_permute", "shapes",
      bug="Accelerometer windows (B, T, 3) are turned channels-first with .view(B, 3, T) instead of "
          ".permute/.transpose, so Conv1d's three 'channels' are interleaved chunks of time and axes.",
      cause_pattern=r"view.{0,80}(permute|transpose)|(permute|transpose).{0,80}view|reshape.{0,60}(instead of|not|"
                    r"rather than).{0,30}(permute|transpose)|interleav|scrambl|channels?.(first|last).{0,80}"
                    r"(view|reshape|layout|order|mix)|(axes|channels|time).{0,40}mixed|\(B, ?T, ?C\).{0,60}"
                    r"\(B, ?C, ?T\)")
def shapes_har_view_not_permute(fixed: bool = False):
    seed(0)
    x, y = har_windows(2)
    xv, yv = har_windows(3, length=5000)
    model = HarCNN(6, fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3),
                train_loader=loader(tds(x, y), 32), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("shapes_har_view_not_permute", fixed_of(shapes_har_view_not_permute),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


def oscillator_windows(n, w, s):
    """Windows of noisy sinusoids with random frequency and phase: the next value needs the last two values."""
    g = torch.Generator().manual_seed(s)
    freq = 0.1 + 0.5 * torch.rand(n, 1, generator=g)
    ph = 2 * math.pi * torch.rand(n, 1, generator=g)
    amp = 0.5 + torch.rand(n, 1, generator=g)
    t = torch.arange(w + 1, dtype=torch.float32)
    s_ = amp * torch.sin(freq * t + ph) + 0.02 * torch.randn(n, w + 1, generator=g)
    return s_[:, :w, None], s_[:, w:]


class LSTMForecaster(nn.Module):
    def __init__(self, batch_first):
        super().__init__()
        self.lstm = nn.LSTM(1, 32, batch_first=batch_first)
        self.head = nn.Linear(32, 1)

    def forward(self, x):                          # x: (B, T, 1)
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


@case("shapes_lstm_not_batch_first", "shapes",
      bug="nn.LSTM built without batch_first=True is fed (B, T, 1) windows: it runs along the batch, and out[:, -1] "
          "is the state after the last time column of all earlier samples, not each window's last state.",
      cause_pattern=r"batch_first|seq(uence)?[_ -]?first|\(T, ?B|\(seq_len, ?batch|(batch|time) (dimension|axis)"
                    r".{0,60}(time|batch|swapped|confused)|runs? (along|over|across) the batch|"
                    r"(recurren|lstm|rnn).{0,60}(across|over) (samples|the batch)")
def shapes_lstm_not_batch_first(fixed: bool = False):
    seed(0)
    x, y = oscillator_windows(3000, 20, 4)
    xv, yv = oscillator_windows(800, 20, 5)
    model = LSTMForecaster(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 5e-3),
                train_loader=loader(tds(x, y), 64), val_loader=loader(tds(xv, yv), 64, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("shapes_lstm_not_batch_first", fixed_of(shapes_lstm_not_batch_first),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


@case("shapes_horizon_reshape_not_transpose", "shapes",
      bug="The multi-step target matrix is stacked per horizon as (H, N) and then .reshape(N, H)'d instead of "
          "transposed, so each window's 12 targets are values of other windows at other lead times.",
      cause_pattern=r"reshape.{0,80}(transpose|\.T\b|permute)|(transpose|\.T\b|permute).{0,80}(reshape|view)|"
                    r"\(H, ?N\).{0,60}\(N, ?H\)|scrambl|horizon.{0,60}(misalign|order|axis|dimension)|"
                    r"target.{0,40}(do not|don't|not) (correspond|match|belong)")
def shapes_horizon_reshape_not_transpose(fixed: bool = False):
    seed(0)
    H, W = 12, 36

    def build(s):
        panel = seasonal_panel(6, 300, s)
        xs, ys = [], []
        for p in panel:
            n = p.numel() - W - H + 1
            xs.append(torch.stack([p[i:i + W] for i in range(n)]))
            by_h = torch.stack([p[W + h:W + h + n] for h in range(H)])   # (H, N): one row per lead time
            ys.append(by_h.T if fixed else by_h.reshape(n, H))           # the bug: reshape instead of .T
        return torch.cat(xs), torch.cat(ys)
    x, y = build(7)
    fixed, keep = True, fixed
    xv, yv = build(8)
    fixed = keep
    model = nn.Sequential(nn.Linear(W, 64), nn.ReLU(), nn.Linear(64, H))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(tds(x, y), 32), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("shapes_horizon_reshape_not_transpose", fixed_of(shapes_horizon_reshape_not_transpose),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


class StepTagger(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.gru = nn.GRU(3, 32, batch_first=True)
        self.head = nn.Linear(32, k)

    def forward(self, x):
        return self.head(self.gru(x)[0])           # (B, T, K)


def per_step_windows(s, length, w=50):
    x, lab = accel_stream(length, 4, s, seg=(10, 30))
    n = length // w
    return x[:n * w].reshape(n, w, 3), lab[:n * w].reshape(n, w)


@case("shapes_per_step_ce_reshape", "shapes",
      bug="Per-timestep activity logits (B, T, K) are given to CrossEntropyLoss as .reshape(B, K, T) instead of "
          ".permute(0, 2, 1), so the class axis is a scramble of time steps and classes.",
      cause_pattern=r"reshape.{0,80}(permute|transpose)|(permute|transpose).{0,80}(reshape|view)|"
                    r"\(B, ?T, ?K\).{0,80}\(B, ?K, ?T\)|\(N, ?C, ?d|class (axis|dimension).{0,60}"
                    r"(dim ?1|second|scrambl|wrong)|scrambl|interleav")
def shapes_per_step_ce_reshape(fixed: bool = False):
    seed(0)
    x, y = per_step_windows(9, 60000)
    xv, yv = per_step_windows(10, 10000)
    model = StepTagger(4)
    ce = nn.CrossEntropyLoss()

    def loss_fn(m, batch):
        xb, yb = batch
        logits = m(xb)
        B, T, K = logits.shape
        logits = logits.permute(0, 2, 1) if fixed else logits.reshape(B, K, T)   # the bug
        return ce(logits, yb)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 5e-3),
                train_loader=loader(tds(x, y), 32), val_loader=loader(tds(xv, yv), 64, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


fix("shapes_per_step_ce_reshape", fixed_of(shapes_per_step_ce_reshape),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val per-step accuracy")
