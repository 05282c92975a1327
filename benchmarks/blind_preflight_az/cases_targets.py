"""Targets: window/target offsets, inverse scaling, window labels, quantile losses, teacher-forced decoders."""

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
    mean_over,
    rmse_of,
    seasonal_panel,
    seed,
    tds,
    windows,
)


def ar_oscillating(length, s):
    """A sensor that overshoots: x_t = -0.85 x_{t-1} + 0.3 sin(2 pi t / 50) + noise."""
    g = gen(s)
    x = torch.zeros(length)
    e = torch.randn(length, generator=g) * 0.5
    for t in range(1, length):
        x[t] = -0.85 * x[t - 1] + 0.3 * math.sin(2 * math.pi * t / 50) + e[t]
    return x


@case("targets_window_includes_target", "targets",
      bug="The window builder takes y = series[i + window - 1], the last sample of the input window, instead of "
          "series[i + window]: the model learns to copy its last input, not to forecast the next step.",
      cause_pattern=r"off.by.one|i ?\+ ?w(indow)? ?- ?1|last (input|sample|value|observation|element) of the "
                    r"(input )?window|target.{0,60}(inside|within|part of|contained in|included in|already in) the "
                    r"(input|window)|(shift|offset).{0,40}(target|label)s?.{0,40}(by one|one step|\+ ?1)|"
                    r"(copy|copies|identity|persistence).{0,60}(last|input)|(target|label)s? (are|is) not shifted")
def targets_window_includes_target(fixed: bool = False):
    seed(0)
    W = 16
    s_tr, s_va = ar_oscillating(4000, 11), ar_oscillating(1200, 12)
    x, y = windows(s_tr, W, 1, offset=0 if fixed else -1)     # the bug: offset -1 -> y = series[i + W - 1]
    xv, yv = windows(s_va, W, 1)
    model = nn.Sequential(nn.Linear(W, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3),
                train_loader=loader(tds(x, y), 64), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("targets_window_includes_target", fixed_of(targets_window_includes_target),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE (next step)", higher=False)


class RevInMLP(nn.Module):
    """Normalises each input window by its own mean and std (RevIN-style) before the MLP."""

    def __init__(self, w, h, denorm):
        super().__init__()
        self.denorm = denorm
        self.net = nn.Sequential(nn.Linear(w, 64), nn.ReLU(), nn.Linear(64, h))

    def forward(self, x):
        mu, sd = x.mean(1, keepdim=True), x.std(1, keepdim=True) + 1e-5
        out = self.net((x - mu) / sd)
        return out * sd + mu if self.denorm else out    # the bug: no inverse scaling of the forecast


def _levels_panel(s):
    g = gen(s)
    p = seasonal_panel(12, 300, s)
    return p * (1 + 4 * torch.rand(12, 1, generator=g)) + 30 * torch.rand(12, 1, generator=g)


def _panel_xy(panel, w, h):
    xs, ys = zip(*(windows(p, w, h) for p in panel))
    return torch.cat(xs), torch.cat(ys)


@case("targets_revin_no_denorm", "targets",
      bug="The forecaster normalises each input window by its own mean/std but never applies the inverse "
          "(out * std + mean) to its output, while the targets stay in raw units: the level and scale of each "
          "series are lost.",
      cause_pattern=r"(inverse|de-?normali[sz]|un-?normali[sz]|re-?scal|invert).{0,60}(scal|normali[sz]|output|"
                    r"forecast|prediction)|(normali[sz]|scal|standardi[sz]).{0,80}(input|window)s?.{0,60}(but|while|"
                    r"not).{0,40}(target|output)|target.{0,40}(raw|original|unscaled|different) (units|scale)|"
                    r"\* ?(sd|std|sigma|scale) ?\+ ?(mu|mean|loc)|revin")
def targets_revin_no_denorm(fixed: bool = False):
    seed(0)
    x, y = _panel_xy(_levels_panel(21), 24, 6)
    xv, yv = _panel_xy(_levels_panel(22), 24, 6)
    model = RevInMLP(24, 6, denorm=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(tds(x, y), 32), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("targets_revin_no_denorm", fixed_of(targets_revin_no_denorm),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE (raw units)", higher=False)


def _har_label_windows(s, length, w=64, stride=8, first=False):
    x, lab = accel_stream(length, 5, s, seg=(30, 80))
    starts = torch.arange(0, length - w, stride)
    idx = starts[:, None] + torch.arange(w)
    wl = lab[idx]
    return x[idx].transpose(1, 2).contiguous(), (wl[:, 0] if first else wl.mode(dim=1).values)


@case("targets_har_label_first_sample", "targets",
      bug="Each accelerometer window is labelled with the activity at its first sample (labels[start]) instead "
          "of the majority (or centre) of the window, so windows that straddle a transition carry the wrong "
          "activity.",
      cause_pattern=r"first sample|labels?\[start\]|\[:, ?0\]|(majority|mode|most (common|frequent)|centre|center|middle) (vote |"
                    r"label |sample |activity )?(of|over|across|in|within) the window|label (the|each) window by|window label.{0,60}(wrong|"
                    r"mislabel|transition|boundar)|(straddl|span|cross).{0,40}(transition|boundar)")
def targets_har_label_first_sample(fixed: bool = False):
    seed(0)
    x, y = _har_label_windows(31, 20000, first=not fixed)
    xv, yv = _har_label_windows(32, 6000)
    model = nn.Sequential(nn.Conv1d(3, 16, 7, padding=3), nn.ReLU(), nn.MaxPool1d(4), nn.Conv1d(16, 32, 5, padding=2),
                          nn.ReLU(), nn.MaxPool1d(2), nn.Flatten(), nn.Linear(32 * 8, 5))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3),
                train_loader=loader(tds(x, y), 32), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("targets_har_label_first_sample", fixed_of(targets_har_label_first_sample),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy (majority label)")


def _skewed(n, d, s):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g) / d ** 0.5
    noise = torch.distributions.Exponential(0.5).sample((n,))
    return x, (x @ w + noise)[:, None]


TAU = 0.9


def pinball(pred, y, tau=TAU):
    err = y - pred
    return torch.maximum(tau * err, (tau - 1) * err).mean()


@case("targets_pinball_sign_flipped", "targets",
      bug="The quantile (pinball) loss for the P90 forecast computes err = pred - target instead of target - pred, "
          "so it fits the 10th percentile, not the 90th.",
      cause_pattern=r"pinball|quantile loss|(pred|prediction|output|forecast) ?- ?(target|y|actual)|(target|y|actual) ?- ?(pred|"
                    r"prediction|output|forecast)|sign.{0,40}(error|residual|flip|revers|swap)|1 ?- ?tau|(10th|p10|0\.1 quantile).{0,40}(instead of|"
                    r"not|rather than).{0,20}(90th|p90|0\.9 quantile)|(90th|p90|0\.9 quantile|tau ?= ?0\.9).{0,60}(10th|"
                    r"p10|0\.1 quantile)")
def targets_pinball_sign_flipped(fixed: torch.Tensor | bool = False):
    seed(0)
    torch.manual_seed(41)
    x, y = _skewed(3000, 8, 41)
    xv, yv = _skewed(800, 8, 42)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))

    def loss_fn(m, batch):
        xb, yb = batch
        pred = m(xb)
        err = (yb - pred) if fixed else (pred - yb)           # the bug: residual sign flipped
        return torch.maximum(TAU * err, (TAU - 1) * err).mean()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(tds(x, y), 64), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


def _pinball_metric(model, kw):
    return mean_over(model, kw["val_loader"], lambda m, b: (pinball(m(b[0]), b[1]).item() * len(b[1]), len(b[1])))


fix("targets_pinball_sign_flipped", fixed_of(targets_pinball_sign_flipped), _pinball_metric,
    "val pinball loss at tau=0.9", higher=False)


class Seq2Seq(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.h = h
        self.enc = nn.GRU(1, 32, batch_first=True)
        self.dec = nn.GRU(1, 32, batch_first=True)
        self.out = nn.Linear(32, 1)

    def forward(self, x, dec_in=None):               # x: (B, W, 1); dec_in: (B, H, 1) teacher inputs
        _, hdn = self.enc(x)
        if dec_in is not None:
            o, _ = self.dec(dec_in, hdn)
            return self.out(o)
        prev, outs = x[:, -1:], []
        for _ in range(self.h):
            o, hdn = self.dec(prev, hdn)
            prev = self.out(o)
            outs.append(prev)
        return torch.cat(outs, 1)


def _s2s_data(s, n_series=10):
    panel = seasonal_panel(n_series, 220, s, noise=0.1)
    panel = (panel - panel.mean(1, keepdim=True)) / panel.std(1, keepdim=True)
    x, y = _panel_xy(panel, 36, 12)
    return x[..., None], y[..., None]


@case("targets_teacher_forcing_unshifted", "targets",
      bug="Teacher forcing feeds the decoder the target sequence itself (dec_in = y) instead of y shifted right by "
          "one (the last observed value, then y[:, :-1]): at step t the decoder sees the value it must predict.",
      cause_pattern=r"shift.{0,60}(right|by one|one step|decoder|target)|not shifted|unshifted|y\[:, ?:-1\]|"
                    r"(decoder|teacher).{0,60}(sees?|given|fed|receives?|input).{0,60}(target|answer|value it|"
                    r"future|ground truth)|teacher forcing.{0,80}(leak|same|itself|copy|identity)|"
                    r"(leak|copy|copies).{0,60}(target|decoder input)")
def targets_teacher_forcing_unshifted(fixed: bool = False):
    seed(0)
    x, y = _s2s_data(51)
    xv, yv = _s2s_data(52, 4)
    model = Seq2Seq(12)
    mse = nn.MSELoss()

    def loss_fn(m, batch):
        xb, yb = batch
        dec_in = torch.cat([xb[:, -1:], yb[:, :-1]], 1) if fixed else yb     # the bug: not shifted
        return mse(m(xb, dec_in), yb)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(tds(x, y), 32), val_loader=loader(tds(xv, yv), 128, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


fix("targets_teacher_forcing_unshifted", fixed_of(targets_teacher_forcing_unshifted),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE (autoregressive rollout)", higher=False)
