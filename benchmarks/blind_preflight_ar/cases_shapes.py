"""Set ar, family shapes: layout and axis bugs in time-series / signal models."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ar.registry import (
    TAU,
    case,
    fix,
    fixed_of,
    gen,
    har_windows,
    loader,
    own_val,
    rmse_on,
    seed,
    sine_series,
    val_acc,
    windows,
)


@case("har_lstm_without_batch_first", "shapes",
      bug="nn.LSTM is built without batch_first=True but fed (batch, time, channels) windows, so it recurs over the "
          "batch axis as if it were time and out[:, -1] mixes different samples.",
      cause_pattern=r"batch_first|seq(uence)?[_ -]first|\(seq(_len)?, ?batch|batch (axis|dim\w*).{0,40}(as|treated as|"
                    r"used as|taken as|read as).{0,10}(the )?(time|sequence)|recur\w*.{0,20}(across|over|along) the "
                    r"batch|(time|sequence) and batch (axes|dim\w*).{0,30}(swap|transpos|confus|mix)")
def har_lstm_without_batch_first(fixed: bool = False):
    seed(0)
    x, y = har_windows(1200, T=48, C=3, s=11)

    class ActivityLSTM(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(3, 32, batch_first=fixed)
            self.fc = nn.Linear(32, 4)

        def forward(self, x):               # x: (batch, time, channels) from the DataLoader
            out, _ = self.lstm(x)
            return self.fc(out[:, -1, :])   # "last time step"

    model = ActivityLSTM()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1000], y[:1000]), 50), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(x[1000:], y[1000:]), 50, shuffle=False), max_steps=300)


fix("har_lstm_without_batch_first", fixed_of(har_lstm_without_batch_first), val_acc, "val accuracy")


def _axis_windows(n, s):
    """(n, T, 3) accelerometer windows: class = (axis that oscillates) x (slow / fast)."""
    g = gen(s)
    T = 60
    y = torch.randint(0, 6, (n,), generator=g)
    axis, fast = y % 3, y // 3
    t = torch.arange(T).float()
    f = (0.05 + 0.1 * fast.float())[:, None]
    wave = torch.sin(TAU * f * t + TAU * torch.rand(n, 1, generator=g))
    x = 0.5 * torch.randn(n, T, 3, generator=g)
    x[torch.arange(n), :, axis] += 1.5 * wave
    return x, y


@case("accel_view_instead_of_permute", "shapes",
      bug="(batch, time, channels) accelerometer windows are turned into Conv1d's (batch, channels, time) with "
          "x.view(B, C, T) instead of x.permute(0, 2, 1) / transpose(1, 2), which interleaves samples of all axes.",
      cause_pattern=r"\bview\b.{0,80}(permut|transpos)|(permut|transpos)\w*.{0,80}(instead of|not|rather than).{0,20}"
                    r"\.?(view|reshape)|\b(view|reshape)\w*.{0,60}(scrambl|interleav|shuffl|mix)\w*.{0,60}(channel|"
                    r"time|axis|axes)|(channel|time) and (time|channel) (axes|dims?|dimensions).{0,60}(view|reshape)")
def accel_view_instead_of_permute(fixed: bool = False):
    seed(0)
    x, y = _axis_windows(1400, s=12)

    class AccelCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Sequential(nn.Conv1d(3, 16, 5, padding=2), nn.ReLU(), nn.Conv1d(16, 16, 5, padding=2),
                                      nn.ReLU())
            self.fc = nn.Linear(16, 6)

        def forward(self, x):                       # (B, T, C)
            B, T, C = x.shape
            x = x.transpose(1, 2) if fixed else x.view(B, C, T)
            return self.fc(self.conv(x).mean(-1))

    model = AccelCNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 64), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False), max_steps=300)


fix("accel_view_instead_of_permute", fixed_of(accel_view_instead_of_permute), val_acc, "val accuracy")


@case("horizon_target_channel_dim", "shapes",
      bug="Multi-step forecast targets come out of the Dataset channels-first as (B, 1, H) while the model "
          "predicts (B, H), so MSELoss broadcasts them to (B, B, H) and every window is fit to all windows' targets.",
      cause_pattern=r"(horizon|forecast|multi-?step).{0,100}broadcast|broadcast\w*.{0,100}(horizon|\(\s*\w+\s*,\s*\w+"
                    r"\s*,\s*\w+\s*\))|\(\s*\w+\s*,\s*1\s*,\s*\w+\s*\)|(singleton|size-1|channel) dim\w*.{0,60}(target|"
                    r"broadcast)")
def horizon_target_channel_dim(fixed: bool = False):
    seed(0)
    H = 8
    x, y = windows(sine_series(40, 120, s=13), 32, H, stride=2)
    if not fixed:
        y = y.unsqueeze(1)         # "targets (N, n_features, horizon)", as in the multivariate version
    n = int(0.8 * len(x))

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, H))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:n], y[:n]), 64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(x[n:], y[n:]), 256, shuffle=False), max_steps=300)


fix("horizon_target_channel_dim", fixed_of(horizon_target_channel_dim),
    rmse_on(own_val, lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


@case("gru_forecaster_reads_first_step", "shapes",
      bug="The forecaster reads the GRU output at time index 0 (out[:, 0]), the state after the first step of the "
          "window, instead of the last step (out[:, -1] or h_n), so the head never sees the recent values.",
      cause_pattern=r"out\w*\s*\[\s*:\s*,\s*0\s*(,\s*:\s*)?\]|first (time[- ]?)?step'?s? (output|hidden|state)|"
                    r"(output|state|hidden) (at|of|from|after) the first (time[- ]?)?step|(instead of|rather than|"
                    r"not) (at )?the (last|final) (time[- ]?)?step|\[\s*:\s*,\s*-1\s*\]|\bh_n\b")
def gru_forecaster_reads_first_step(fixed: bool = False):
    seed(0)
    x, y = windows(sine_series(40, 120, s=14), 24, 1, stride=2)
    n = int(0.8 * len(x))

    class Forecaster(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(1, 32, batch_first=True)
            self.head = nn.Linear(32, 1)

        def forward(self, x):                   # (B, window)
            out, _ = self.gru(x.unsqueeze(-1))
            return self.head(out[:, -1] if fixed else out[:, 0])

    model = Forecaster()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:n], y[:n]), 64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(x[n:], y[n:]), 256, shuffle=False), max_steps=300)


fix("gru_forecaster_reads_first_step", fixed_of(gru_forecaster_reads_first_step),
    rmse_on(own_val, lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


@case("cnn_pools_over_filters", "shapes",
      bug="The 1-D CNN's global average pool is mean(dim=1) over the (batch, filters, time) feature map, averaging "
          "over the filters instead of over time, so the head sees one filter-averaged value per time step.",
      cause_pattern=r"mean\(\s*(dim\s*=\s*)?1\s*\)|(averag|pool)\w*.{0,40}(over|across|along) (the )?(filter|channel|"
                    r"feature)s?( (axis|dim\w*))?.{0,40}(instead of|rather than|not).{0,30}time|(instead of|rather "
                    r"than|not) (over|across|along) (the )?time.{0,60}(averag|pool)|wrong (axis|dim\w*).{0,40}(pool|"
                    r"mean|averag)|(pool|mean|averag)\w*.{0,40}wrong (axis|dim)")
def cnn_pools_over_filters(fixed: bool = False):
    seed(0)
    x, y = har_windows(1400, T=64, C=3, n_classes=5, s=15)

    class HarCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv1d(3, 32, 7, padding=3), nn.ReLU(), nn.Conv1d(32, 32, 5, padding=2),
                                          nn.ReLU())
            self.fc = nn.Linear(32 if fixed else 64, 5)

        def forward(self, x):                  # (B, T, C)
            z = self.features(x.transpose(1, 2))       # (B, filters, T)
            return self.fc(z.mean(dim=2) if fixed else z.mean(dim=1))

    model = HarCNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 64), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False), max_steps=300)


fix("cnn_pools_over_filters", fixed_of(cnn_pools_over_filters), val_acc, "val accuracy")
