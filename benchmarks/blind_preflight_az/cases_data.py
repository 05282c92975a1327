"""Data: covariates joined by position, windows across series boundaries, gaps filled with zeros, rows dropped
from the features only, activity recordings fed in order."""

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
    gen,
    loader,
    rmse_of,
    seasonal_panel,
    seed,
    tds,
    windows,
)


def _load_and_temp(s, n):
    """Hourly load (centred) driven by the temperature of the same hour."""
    g = gen(s)
    t = torch.arange(n, dtype=torch.float32)
    temp = 15 + 8 * torch.sin(2 * math.pi * t / 24 + 1) + 6 * torch.sin(2 * math.pi * t / 200) + \
        2 * torch.randn(n, generator=g)
    load = 3 * (temp - 15) / 8 + 0.2 * torch.randn(n, generator=g)
    return temp, load


def _cov_xy(temp, load, w=12):
    lx, ly = windows(load, w, 1)
    tx = temp[w:w + len(ly)]                              # the temperature at the target hour (weather forecast)
    return torch.cat([lx, (tx[:, None] - 15) / 8], 1), ly


@case("data_covariate_joined_by_position", "data",
      bug="The weather table comes sorted newest-first and is joined to the load table by row position instead of "
          "by timestamp, so each window's temperature covariate belongs to a different hour.",
      cause_pattern=r"(join|merge|align|concat).{0,60}(position|row order|index|timestamp)|timestamp.{0,60}"
                    r"(align|join|merge|match)|(sort|order).{0,60}(descending|newest|revers|differ)|revers.{0,60}"
                    r"(order|covariate|time)|covariate.{0,60}(misalign|different (hour|time)|wrong (hour|time)|"
                    r"shuffled|not aligned)")
def data_covariate_joined_by_position(fixed: bool = False):
    seed(0)
    temp, load = _load_and_temp(161, 3000)
    if not fixed:
        temp = temp.flip(0)                               # the bug: newest-first table pasted on by position
    x, y = _cov_xy(temp, load)
    xv, yv = _cov_xy(*_load_and_temp(162, 1000))
    model = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(tds(x, y), 32), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("data_covariate_joined_by_position", fixed_of(data_covariate_joined_by_position),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


def _stacked_panel(s, n_series=24, length=60):
    g = gen(s)
    p = seasonal_panel(n_series, length, s, noise=0.1)
    return p * (1 + 3 * torch.rand(n_series, 1, generator=g)) + 20 * torch.randn(n_series, 1, generator=g)


@case("data_windows_cross_series_boundary", "data",
      bug="All series are concatenated into one long array before the sliding windows are cut, so many windows "
          "start in one series and end (or take their target) in the next.",
      cause_pattern=r"(cross|span|straddl|across).{0,40}(series|boundar)|boundar.{0,60}(series|window)|"
                    r"concatenat.{0,80}(series|before|window)|(per|each|within (each|a|one)|by) series|groupby|"
                    r"(window|target)s?.{0,60}(two|different|another|next) series|(mix|mixed).{0,40}series")
def data_windows_cross_series_boundary(fixed: bool = False):
    seed(0)
    W = 24

    def build(panel, per_series):
        if per_series:
            xs, ys = zip(*(windows(p, W, 1) for p in panel))
            return torch.cat(xs), torch.cat(ys)
        return windows(panel.reshape(-1), W, 1)        # the bug: one long array across series
    x, y = build(_stacked_panel(171), fixed)
    xv, yv = build(_stacked_panel(172, 8), True)
    mu, sd = x.mean(1, keepdim=True), x.std(1, keepdim=True) + 1e-3

    class Local(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(W, 64), nn.ReLU(), nn.Linear(64, 1))

        def forward(self, xb):
            m, s = xb.mean(1, keepdim=True), xb.std(1, keepdim=True) + 1e-3
            return self.net((xb - m) / s) * s + m
    del mu, sd
    model = Local()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(tds(x, y), 32), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("data_windows_cross_series_boundary", fixed_of(data_windows_cross_series_boundary),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


def _temperature_with_gaps(s, n, p_missing):
    g = gen(s)
    t = torch.arange(n, dtype=torch.float32)
    v = 20 + 5 * torch.sin(2 * math.pi * t / 24) + 0.5 * torch.randn(n, generator=g)
    v[torch.rand(n, generator=g) < p_missing] = float("nan")
    return v


def _ffill(v):
    v = v.clone()
    for i in range(1, len(v)):
        if torch.isnan(v[i]):
            v[i] = v[i - 1]
    return v


@case("data_gaps_filled_with_zero", "data",
      bug="Sensor dropouts (NaN) are filled with 0 (fillna(0)) in a temperature series around 20 degrees, so 15% of "
          "inputs and targets are fake zeros and the forecasts are dragged down.",
      cause_pattern=r"fillna|fill.{0,30}(zero|0)|(zero|0)s?.{0,40}(fill|imput|replac|placeholder|missing)|(missing|nan|"
                    r"gap)s?.{0,60}(zero|imput|forward.?fill|ffill|interpolat|mask)|(sensor )?dropouts?.{0,40}(fill|zero)|"
                    r"forward.?fill|ffill|fake zeros")
def data_gaps_filled_with_zero(fixed: bool = False):
    seed(0)
    raw = _temperature_with_gaps(181, 4000, 0.15)
    series = _ffill(raw) if fixed else torch.nan_to_num(raw, nan=0.0)   # the bug: fillna(0)
    x, y = windows(series, 24, 1)
    xv, yv = windows(_ffill(_temperature_with_gaps(182, 1000, 0.0)), 24, 1)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(tds(x, y), 32), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("data_gaps_filled_with_zero", fixed_of(data_gaps_filled_with_zero),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


def _machine_log(s, n):
    """Machine telemetry: the next-hour power depends on the current vibration reading (a covariate with gaps)."""
    g = gen(s)
    t = torch.arange(n, dtype=torch.float32)
    vib = torch.sin(2 * math.pi * t / 17) + 0.5 * torch.sin(2 * math.pi * t / 7) + 0.1 * torch.randn(n, generator=g)
    power = torch.zeros(n)
    power[1:] = 3 * vib[:-1] + 0.1 * torch.randn(n - 1, generator=g)
    missing = torch.rand(n, generator=g) < 0.1
    return vib, power, missing


@case("data_dropna_features_only", "data",
      bug="Rows with a missing vibration reading are dropped from the feature table (dropna) but the targets are "
          "taken from the full series by position (y[:len(X)]), so after the first gap every target is shifted "
          "against its features, more with every dropped row.",
      cause_pattern=r"dropna|drop(ped|ping)? (rows|nan).{0,80}(target|label|feature)|(target|label)s?.{0,60}"
                    r"(misalign|shift|offset|out of (sync|step))|(features?|inputs?) (and|vs\.?) (target|label)s?"
                    r".{0,40}(misalign|not aligned|out of sync)|y\[:len\(x\)\]|same (mask|rows|index)")
def data_dropna_features_only(fixed: bool = False):
    seed(0)
    vib, power, missing = _machine_log(191, 4000)
    feats = torch.stack([vib[:-1], power[:-1]], 1)           # row t: readings at hour t
    target = power[1:, None]                                  # next-hour power
    keep = ~missing[:-1]
    x = feats[keep]
    y = target[keep] if fixed else target[:len(x)]           # the bug: targets not filtered with the same mask
    vv, pv, _ = _machine_log(192, 1000)
    xv, yv = torch.stack([vv[:-1], pv[:-1]], 1), pv[1:, None]
    model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(tds(x, y), 32), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("data_dropna_features_only", fixed_of(data_dropna_features_only),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


def _recordings_by_activity(s, length=48000, w=64, stride=4):
    x, lab = accel_stream(length, 5, s, seg=(200, 400))
    starts = torch.arange(0, length - w, stride)
    idx = starts[:, None] + torch.arange(w)
    xw, yw = x[idx].transpose(1, 2).contiguous(), lab[idx].mode(dim=1).values
    order = torch.argsort(yw, stable=True)                    # one recording file per activity, read in turn
    return xw[order], yw[order]


@case("data_har_sorted_no_shuffle", "data",
      bug="The activity windows are stored one activity after another (one file per activity) and the training "
          "DataLoader has shuffle=False (the user keeps time order), so every batch holds a single activity and "
          "the model forgets the earlier ones.",
      cause_pattern=r"sorted (by|per) (class|label|activity)|(order|ordered|grouped|sorted|blocks?).{0,60}(class|label|"
                    r"activity)|(single|one|same) (class|activity|label) (per|in each|in every) batch|(each|every) batch.{0,40}(one|"
                    r"single|same) (class|activity|label)|catastrophic forgetting|forgets?")
def data_har_sorted_no_shuffle(fixed: bool = False):
    seed(0)
    x, y = _recordings_by_activity(201)
    xv, yv = _recordings_by_activity(202, 12000, stride=32)
    model = nn.Sequential(nn.Conv1d(3, 32, 7, padding=3), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                          nn.Linear(32, 5))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(tds(x, y), 32, shuffle=fixed),   # the bug: shuffle=False on sorted windows
                val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("data_har_sorted_no_shuffle", fixed_of(data_har_sorted_no_shuffle),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")
