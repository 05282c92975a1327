"""What is trained: series-id embeddings, decoders, hour-of-day effects, per-series scales, rebuilt models."""

from __future__ import annotations

import math

import torch
from torch import nn

from benchmarks.blind_preflight_az.registry import case, fix, fixed_of, gen, loader, mean_over, rmse_of, seed, tds


def _global_panel(s, n_series=20, length=200, w=24):
    """Many series that share a daily shape but each sits at its own level; the inputs are the windows with the
    window mean removed (a user's 'level-free' inputs), the target the raw next value."""
    g = gen(s)
    gl = gen(777)                                   # series levels: the same series in train and val
    t = torch.arange(length, dtype=torch.float32)
    level = torch.randn(n_series, 1, generator=gl) * 3
    ph = 2 * math.pi * torch.rand(n_series, 1, generator=gl)
    p = level + torch.sin(2 * math.pi * t / 24 + ph) + 0.1 * torch.randn(n_series, length, generator=g)
    idx = torch.arange(length - w)[:, None] + torch.arange(w)
    x = p[:, idx]                                   # (S, N, W)
    y = p[:, w:]                                    # (S, N)
    sid = torch.arange(n_series)[:, None].expand_as(y)
    x = x - x.mean(-1, keepdim=True)
    return x.reshape(-1, w), sid.reshape(-1), y.reshape(-1, 1)


class GlobalForecaster(nn.Module):
    def __init__(self, n_series, w, series_bias):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(w, 64), nn.ReLU(), nn.Linear(64, 1))
        self.series_bias = series_bias

    def forward(self, x, sid):
        return self.net(x) + self.series_bias(sid)


def _two_input_loss(m, batch):
    x, sid, y = batch
    return nn.functional.mse_loss(m(x, sid), y)


@case("trained_series_bias_from_pretrained_frozen", "what_is_trained",
      bug="The per-series level embedding is made with nn.Embedding.from_pretrained(torch.zeros(S, 1)), whose "
          "freeze=True default keeps it at zero: the series-id embedding is never trained.",
      cause_pattern=r"from_pretrained|freeze ?= ?(true|false)|freeze.{0,20}default|(embedding|series.?(id|bias)|level).{0,60}(never|"
                    r"not|isn't|is not) (trained|updated|learn)|(embedding|series.?(id|bias)).{0,40}(frozen|requires_grad ?= ?false)|"
                    r"(frozen|requires_grad ?= ?false).{0,60}(embedding|series)|(no|zero) grad(ient)?s?.{0,60}(embedding|"
                    r"series)")
def trained_series_bias_from_pretrained_frozen(fixed: bool = False):
    seed(0)
    x, sid, y = _global_panel(61)
    xv, sv, yv = _global_panel(62)
    bias = nn.Embedding.from_pretrained(torch.zeros(20, 1), freeze=not fixed)   # the bug: freeze=True default
    model = GlobalForecaster(20, 24, bias)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-2),
                train_loader=loader(tds(x, sid, y), 32), val_loader=loader(tds(xv, sv, yv), 256, shuffle=False),
                loss_fn=_two_input_loss, max_steps=300)


fix("trained_series_bias_from_pretrained_frozen", fixed_of(trained_series_bias_from_pretrained_frozen),
    rmse_of(lambda m, b: (m(b[0], b[1]), b[2])), "val RMSE", higher=False)


def _normal_windows(n, s, w=32):
    """'Normal' vibration windows: a mix of three fixed waveforms plus a little noise."""
    g = gen(s)
    t = torch.arange(w, dtype=torch.float32)
    basis = torch.stack([torch.sin(2 * math.pi * t / 16), torch.cos(2 * math.pi * t / 8),
                         torch.sin(2 * math.pi * t / 5.3)])
    coef = torch.randn(n, 3, generator=g)
    return coef @ basis + 0.05 * torch.randn(n, w, generator=g)


class WindowAE(nn.Module):
    def __init__(self, w=32, z=3):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(w, 32), nn.ReLU(), nn.Linear(32, z))
        self.decoder = nn.Sequential(nn.Linear(z, 32), nn.ReLU(), nn.Linear(32, w))

    def forward(self, x):
        return self.decoder(self.encoder(x))


@case("trained_ae_optimizer_encoder_only", "what_is_trained",
      bug="The anomaly-detection autoencoder's optimizer is given model.encoder.parameters() only: the decoder stays "
          "at its random init and the reconstruction of normal windows cannot be learned.",
      cause_pattern=r"encoder\.parameters|decoder.{0,80}(not|never|missing|excluded|left out|isn't|is not|random|untrained|"
                    r"frozen)|(optimi[sz]er|param(eter)? (list|group)s?).{0,80}(missing|omit|exclud|leaves? out|without|"
                    r"lacks?).{0,40}decoder|(only|just) (the )?encoder")
def trained_ae_optimizer_encoder_only(fixed: bool = False):
    seed(0)
    x, xv = _normal_windows(3000, 71), _normal_windows(600, 72)
    model = WindowAE()
    params = model.parameters() if fixed else model.encoder.parameters()   # the bug: decoder left out
    return dict(model=model, optimizer=torch.optim.Adam(params, 3e-3),
                train_loader=loader(tds(x), 32), val_loader=loader(tds(xv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("trained_ae_optimizer_encoder_only", fixed_of(trained_ae_optimizer_encoder_only),
    rmse_of(lambda m, b: (m(b[0]), b[0])), "val reconstruction RMSE (normal windows)", higher=False)


def _hourly(s, n=4000):
    g = gen(s)
    effect = torch.randn(24, generator=gen(888)) * 1.5          # the hour-of-day effect (same plant every year)
    r = torch.zeros(n + 6)
    e = torch.randn(n + 6, generator=g) * 0.3
    for t in range(1, n + 6):
        r[t] = 0.8 * r[t - 1] + e[t]
    lags = torch.stack([r[i:i + n] for i in range(6)], 1)
    hour = torch.randint(0, 24, (n,), generator=g)
    y = 0.8 * lags[:, -1] + effect[hour] + 0.1 * torch.randn(n, generator=g)
    return lags, hour, y[:, None]


class HourlyModel(nn.Module):
    def __init__(self, registered):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
        if registered:
            self.hour_effect = nn.Parameter(torch.zeros(24))
        else:
            self.hour_effect = torch.zeros(24, requires_grad=True)  # the bug: a plain tensor, not a Parameter

    def forward(self, lags, hour):
        return self.net(lags) + self.hour_effect.to(lags.device)[hour][:, None]


@case("trained_hour_effect_plain_tensor", "what_is_trained",
      bug="The hour-of-day effect (a known future covariate) is a plain torch.zeros(24, requires_grad=True) "
          "attribute, not an nn.Parameter: it is not in model.parameters(), so the optimizer never updates it.",
      cause_pattern=r"nn\.parameter|register_(parameter|buffer)|plain tensor|not (a |an )?(registered|parameter)|"
                    r"(not|never) in model\.parameters|requires_grad ?= ?true.{0,80}(not|never|isn't)|"
                    r"(hour|calendar|covariate).{0,60}(never|not) (trained|updated|learn)|unregistered")
def trained_hour_effect_plain_tensor(fixed: bool = False):
    seed(0)
    x, hr, y = _hourly(81)
    xv, hv, yv = _hourly(82, 1000)
    model = HourlyModel(registered=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 1e-2),
                train_loader=loader(tds(x, hr, y), 32), val_loader=loader(tds(xv, hv, yv), 256, shuffle=False),
                loss_fn=_two_input_loss, max_steps=300)


fix("trained_hour_effect_plain_tensor", fixed_of(trained_hour_effect_plain_tensor),
    rmse_of(lambda m, b: (m(b[0], b[1]), b[2])), "val RMSE", higher=False)


def _load_windows(s, n=3000, w=24):
    g = gen(s)
    t = torch.arange(n + w + 1, dtype=torch.float32)
    p = 5 + 3 * torch.sin(2 * math.pi * t / 24) + torch.sin(2 * math.pi * t / 168) + 0.2 * torch.randn(n + w + 1,
                                                                                                     generator=g)
    idx = torch.arange(n)[:, None] + torch.arange(w)
    return p[idx], p[w:w + n, None]


def _mlp():
    return nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1))


@case("trained_model_rebuilt_after_optimizer", "what_is_trained",
      bug="The model is re-created (model = _mlp(), a re-run notebook cell) after the optimizer was built on the "
          "first instance: the optimizer steps the old model's parameters and the model that is trained and "
          "evaluated never changes.",
      cause_pattern=r"(re-?created|re-?built|re-?instantiat|new (model|instance)|different (model|instance)|another (model|"
                    r"instance)|old (model|instance)|stale).{0,80}(optimi[sz]er|param)|optimi[sz]er.{0,80}(other|old|"
                    r"different|previous|first|stale|separate).{0,30}(model|instance|param)|not (in|among) the optimi[sz]er|"
                    r"model\.parameters\(\) (is|are) not|(optimi[sz]er|it) (holds|steps|updates|references) (the )?(parameters|"
                    r"weights) of (a|an|the) (other|old|different|previous|first)")
def trained_model_rebuilt_after_optimizer(fixed: bool = False):
    seed(0)
    x, y = _load_windows(91)
    xv, yv = _load_windows(92, 800)
    model = _mlp()
    optimizer = torch.optim.Adam(model.parameters(), 3e-3)
    if not fixed:
        torch.manual_seed(0)
        model = _mlp()                                    # the bug: rebuilt after the optimizer
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(tds(x, y), 32), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("trained_model_rebuilt_after_optimizer", fixed_of(trained_model_rebuilt_after_optimizer),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


def _scaled_panel(s, n_series=16, length=200, w=24):
    """Inputs divided by each series' stored std (per-series scaling); targets in raw units, so the model must
    learn each series' scale back (series_scale[id])."""
    g = gen(s)
    gl = gen(999)
    t = torch.arange(length, dtype=torch.float32)
    amp = 1 + 9 * torch.rand(n_series, 1, generator=gl)
    ph = 2 * math.pi * torch.rand(n_series, 1, generator=gl)
    p = amp * (torch.sin(2 * math.pi * t / 24 + ph) + 0.1 * torch.randn(n_series, length, generator=g))
    idx = torch.arange(length - w)[:, None] + torch.arange(w)
    x = p[:, idx] / amp[:, :, None]
    y = p[:, w:]
    sid = torch.arange(n_series)[:, None].expand_as(y)
    return x.reshape(-1, w), sid.reshape(-1), y.reshape(-1, 1)


class ScaledGlobal(nn.Module):
    def __init__(self, n_series):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1))
        self.series_scale = nn.Parameter(torch.ones(n_series))

    def forward(self, x, sid):
        return self.net(x) * self.series_scale[sid][:, None]


@case("trained_series_scale_not_in_optimizer", "what_is_trained",
      bug="The optimizer is built from model.net.parameters(), leaving out the per-series scale parameter "
          "(series_scale) that maps scaled outputs back to each series' units: it stays at 1.",
      cause_pattern=r"net\.parameters|series_scale|(per-?series )?scale.{0,60}(not|never|missing|excluded|left out).{0,40}(optimi[sz]|"
                    r"train|updat)|(optimi[sz]er|param(eter)? (list|group)s?).{0,80}(missing|omit|exclud|leaves? out|"
                    r"without|lacks?).{0,40}(scale|series)|stays? at (1|one)")
def trained_series_scale_not_in_optimizer(fixed: bool = False):
    seed(0)
    x, sid, y = _scaled_panel(101)
    xv, sv, yv = _scaled_panel(102)
    model = ScaledGlobal(16)
    params = model.parameters() if fixed else model.net.parameters()     # the bug: series_scale left out
    return dict(model=model, optimizer=torch.optim.Adam(params, 1e-2),
                train_loader=loader(tds(x, sid, y), 32), val_loader=loader(tds(xv, sv, yv), 256, shuffle=False),
                loss_fn=_two_input_loss, max_steps=300)


fix("trained_series_scale_not_in_optimizer", fixed_of(trained_series_scale_not_in_optimizer),
    rmse_of(lambda m, b: (m(b[0], b[1]), b[2])), "val RMSE", higher=False)


_ = mean_over
