"""Family ``shapes``: axes of windows, channels, horizons and quantiles laid out wrongly."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_bj.models import GRUForecaster
from benchmarks.blind_preflight_bj.registry import (case, fix, fixed_of, loaders, mae_of, mlp, pinball, seed, series,
                                                    time_split, val_mae, windows)

L, H = 24, 3


def _windows(s=0, **kw):
    tr, va = time_split(series(s=s, **kw))
    return windows(tr, L, H), windows(va, L, H)


@case("s_gru_batch_first", "shapes",
      "The GRU forecaster is built without batch_first=True but fed (batch, window, 1) tensors, so the GRU runs "
      "along the batch axis and treats the window steps as the batch: each forecast mixes other samples' values.",
      r"batch_first|(batch|sample)s?\b.{0,40}\b(treated|read|interpreted|taken|used|runs?|iterat\w*).{0,30}"
      r"\b(as|along|over)\b.{0,20}\b(time|sequence|seq)|(time|sequence).{0,40}(axis|dim\w*).{0,40}(batch).{0,30}"
      r"(swap|transpos|confus|mix)|(seq_len|sequence|time)[, ]+batch.{0,40}(layout|order|format)")
def s_gru_batch_first(fixed=False):
    seed(0)
    tr, va = _windows()
    model = GRUForecaster(H, batch_first=fixed)
    tl, vl = loaders(tr, va)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


fix("s_gru_batch_first", fixed_of(s_gru_batch_first), val_mae, "val MAE", higher=False)


class ConvCal(nn.Module):
    """1-D conv over (B, L, F) windows of value + calendar features, forecasting from the last position; the broken
    variant reshapes instead of transposing."""

    def __init__(self, F, transpose):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(F, 32, 5, padding=2), nn.ReLU(), nn.Conv1d(32, 32, 5, padding=2), nn.ReLU())
        self.head = nn.Linear(32, H)
        self.transpose = transpose

    def forward(self, x):
        B, T, F = x.shape
        z = x.transpose(1, 2) if self.transpose else x.reshape(B, F, T)
        return self.head(self.net(z)[..., -1])


def _with_calendar(X, Y, start_phase):
    t = torch.arange(X.shape[1]).float()
    hour = (t + start_phase[:, None]) % 12
    return torch.stack([X, torch.sin(hour / 12 * 6.283), torch.cos(hour / 12 * 6.283)], dim=-1), Y


@case("s_conv_view", "shapes",
      "The (batch, time, features) window is turned into Conv1d's (batch, channels, time) layout with .reshape/.view "
      "instead of .transpose(1, 2), which scrambles time steps and features into every channel.",
      r"(view|reshape).{0,80}(instead of|rather than|not).{0,30}(transpose|permute)|"
      r"(transpose|permute).{0,60}(instead of|rather than|not).{0,30}(view|reshape)|"
      r"(view|reshape)\w*.{0,60}(scrambl|interleav|mix|shuffl|garbl|jumbl).{0,40}(time|channel|feature)")
def s_conv_view(fixed=False):
    seed(1)
    (xt, yt), (xv, yv) = _windows(s=1)
    tr = _with_calendar(xt, yt, torch.arange(len(xt)).float())
    va = _with_calendar(xv, yv, torch.arange(len(xv)).float())
    model = ConvCal(3, transpose=fixed)
    tl, vl = loaders(tr, va)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


fix("s_conv_view", fixed_of(s_conv_view), val_mae, "val MAE", higher=False)

QS = torch.tensor([0.1, 0.5, 0.9])


class QuantileMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp(L, H * 3)

    def forward(self, x):
        return self.net(x).view(-1, H, 3)


def quantile_loss(fixed):
    def loss_fn(model, batch):
        x, y = batch
        pred = model(x)                                   # (B, H, Q) with H == Q == 3
        e = (y.unsqueeze(-1) if fixed else y.unsqueeze(1)) - pred
        return torch.maximum(QS * e, (QS - 1) * e).mean()
    return loss_fn


@case("s_quantile_broadcast", "shapes",
      "In the pinball loss the (batch, horizon) target is unsqueezed at dim 1 instead of the last dim, so against the "
      "(batch, horizon, quantile) predictions with horizon == quantiles == 3 it broadcasts each quantile against a "
      "different horizon step.",
      r"unsqueeze\(-1\)|(quantile|pinball).{0,120}(broadcast|align|horizon.{0,20}(step|axis|dim))|"
      r"broadcast.{0,100}(quantile|horizon)|(horizon|quantile).{0,60}(axis|dim\w*).{0,60}(swap|confus|mismatch|misalign|against)")
def s_quantile_broadcast(fixed=False):
    seed(2)
    tr, va = _windows(s=2, noise=0.3)
    model = QuantileMLP()
    tl, vl = loaders(tr, va)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=quantile_loss(fixed), val_loader=vl)


fix("s_quantile_broadcast", fixed_of(s_quantile_broadcast), mae_of(lambda m, b: (m(b[0])[..., 1], b[1])),
    "val MAE of the median", higher=False)


@case("s_last_step_index", "shapes",
      "The forecaster reads the GRU output at out[:, 0] (after the first, oldest step of the window) instead of "
      "out[:, -1], so the head sees a state that has read one value only.",
      r"out\w*\[:, ?0\]|\[:, ?-1\]|(output|state|hidden)\w*.{0,40}(at|after|from|of) the (first|oldest|earliest)|"
      r"(last|final|latest|most recent).{0,30}(time ?step|step|position|output|state).{0,60}(instead|should|rather|not)")
def s_last_step_index(fixed=False):
    seed(3)
    tr, va = _windows(s=3)
    model = GRUForecaster(H, idx=-1 if fixed else 0)
    tl, vl = loaders(tr, va)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


fix("s_last_step_index", fixed_of(s_last_step_index), val_mae, "val MAE", higher=False)

LAGS = (1, 2, 3, 6, 12, 24)


def lag_features(X, fixed):
    cols = [X[:, -k] for k in LAGS]
    return torch.stack(cols, dim=1 if fixed else 0).reshape(len(X), len(LAGS))


@case("s_lag_stack_dim", "shapes",
      "The lag-feature matrix is built with torch.stack(lag_columns, dim=0).reshape(N, n_lags) instead of "
      "stack(..., dim=1), so each row holds lag values of several different windows, not its own.",
      r"stack.{0,60}dim ?= ?[01]|(lag|feature)s?.{0,80}(row|sample|window)s?.{0,80}(mix|scrambl|wrong|other|different|"
      r"misalign|shuffl)|(reshape|view).{0,60}(transpose|\.t\(\)|stack)")
def s_lag_stack_dim(fixed=False):
    seed(4)
    (xt, yt), (xv, yv) = _windows(s=4)
    tr, va = (lag_features(xt, fixed), yt), (lag_features(xv, fixed), yv)
    model = mlp(len(LAGS), H)
    tl, vl = loaders(tr, va)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


fix("s_lag_stack_dim", fixed_of(s_lag_stack_dim), val_mae, "val MAE", higher=False)
