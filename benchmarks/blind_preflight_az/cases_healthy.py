"""Healthy: five corrected twins of broken cases and five unusual-but-correct forecasting / sensor setups."""

from __future__ import annotations

import math

import torch
from torch import nn

from benchmarks.blind_preflight_az.cases_data import data_windows_cross_series_boundary
from benchmarks.blind_preflight_az.cases_mechanics import mechanics_detach_inside_time_loop
from benchmarks.blind_preflight_az.cases_shapes import har_windows, shapes_next_step_target_1d
from benchmarks.blind_preflight_az.cases_targets import Seq2Seq, _s2s_data, targets_pinball_sign_flipped
from benchmarks.blind_preflight_az.cases_trained import _normal_windows, trained_series_bias_from_pretrained_frozen
from benchmarks.blind_preflight_az.registry import gen, healthy, loader, seasonal_panel, seed, tds, twin, windows

healthy("healthy_next_step_target_2d", "twin of shapes_next_step_target_1d: (N, 1) targets against the (B, 1) "
        "output")(twin(shapes_next_step_target_1d))
healthy("healthy_pinball_p90", "twin of targets_pinball_sign_flipped: err = target - pred for the P90 "
        "forecast")(twin(targets_pinball_sign_flipped))
healthy("healthy_series_bias_trainable", "twin of trained_series_bias_from_pretrained_frozen: "
        "from_pretrained(..., freeze=False)")(twin(trained_series_bias_from_pretrained_frozen))
healthy("healthy_gru_cell_full_bptt", "twin of mechanics_detach_inside_time_loop: no detach inside the time "
        "loop")(twin(mechanics_detach_inside_time_loop))
healthy("healthy_windows_per_series", "twin of data_windows_cross_series_boundary: windows cut within each "
        "series")(twin(data_windows_cross_series_boundary))


@healthy("healthy_seq2seq_teacher_forcing_onecycle",
         "GRU encoder-decoder trained with correctly shifted teacher forcing, gradient clipping at 1.0 and a "
         "OneCycleLR sized to max_steps; evaluated by autoregressive rollout")
def healthy_seq2seq_teacher_forcing_onecycle():
    seed(0)
    x, y = _s2s_data(301)
    xv, yv = _s2s_data(302, 4)
    model = Seq2Seq(12)
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=200)
    mse = nn.MSELoss()

    def loss_fn(m, batch):
        xb, yb = batch
        dec_in = torch.cat([xb[:, -1:], yb[:, :-1]], 1)   # last observed value, then the targets shifted right
        return mse(m(xb, dec_in), yb)
    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=loader(tds(x, y), 32),
                val_loader=loader(tds(xv, yv), 128, shuffle=False), loss_fn=loss_fn, max_steps=200,
                clip_grad_norm=1.0)


class HarNet(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(3, 32, 7, padding=3), nn.GroupNorm(4, 32), nn.GELU(),
                                  nn.Conv1d(32, 32, 5, padding=2), nn.GELU(), nn.AdaptiveAvgPool1d(1), nn.Flatten())
        self.head = nn.Linear(32, k)

    def forward(self, x):                         # (B, T, 3) -> channels first with a transpose
        return self.head(self.body(x.transpose(1, 2)))


@healthy("healthy_har_bf16_param_groups",
         "HAR 1D-CNN on channels-last windows transposed in forward, bf16 autocast, label smoothing 0.1, AdamW with "
         "no weight decay on biases and norm weights (two param groups)")
def healthy_har_bf16_param_groups():
    seed(0)
    x, y = har_windows(311)
    xv, yv = har_windows(312, length=5000)
    model = HarNet(6)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}], lr=2e-3)
    return dict(model=model, optimizer=opt, train_loader=loader(tds(x, y), 32),
                val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1), precision="bf16", max_steps=200)


class ScaledGlobalModel(nn.Module):
    """Global model: per-series mean/std kept as buffers (fitted on the training period), a series-id embedding,
    inputs scaled per series and the forecast scaled back."""

    def __init__(self, mean, std, w, h):
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)
        self.emb = nn.Embedding(len(mean), 4)
        self.net = nn.Sequential(nn.Linear(w + 4, 64), nn.ReLU(), nn.Linear(64, h))

    def forward(self, x, sid):
        m, s = self.mean[sid][:, None], self.std[sid][:, None]
        out = self.net(torch.cat([(x - m) / s, self.emb(sid)], 1))
        return out * s + m


@healthy("healthy_global_model_accum_warmup_cosine",
         "multi-series global model with series-id embeddings and per-series scaling buffers, 4-step gradient "
         "accumulation and a linear-warm-up + cosine LambdaLR sized to max_steps")
def healthy_global_model_accum_warmup_cosine():
    seed(0)
    g = gen(321)
    panel = seasonal_panel(12, 320, 321) * (1 + 4 * torch.rand(12, 1, generator=g)) + 10
    train, val = panel[:, :240], panel[:, 240 - 24:]
    mean, std = train.mean(1), train.std(1)

    def xy(p):
        xs, ys, ids = [], [], []
        for i, row in enumerate(p):
            a, b = windows(row, 24, 4)
            xs.append(a)
            ys.append(b)
            ids.append(torch.full((len(a),), i))
        return torch.cat(xs), torch.cat(ids), torch.cat(ys)
    x, sid, y = xy(train)
    xv, sv, yv = xy(val)
    model = ScaledGlobalModel(mean, std, 24, 4)
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    steps, warm = 200, 20

    def lr_at(step):
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / (steps - warm))))

    def loss_fn(m, batch):
        xb, sb, yb = batch
        s = m.std[sb][:, None]
        return nn.functional.mse_loss(m(xb, sb) / s, yb / s)   # errors in each series' own units
    return dict(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lr_at),
                train_loader=loader(tds(x, sid, y), 32), val_loader=loader(tds(xv, sv, yv), 256, shuffle=False),
                loss_fn=loss_fn, accumulation_steps=4, max_steps=steps)


class LSTMAutoencoder(nn.Module):
    """LSTM encoder, 8-d bottleneck, MLP decoder emitting the whole window."""

    def __init__(self, w=32):
        super().__init__()
        self.enc = nn.LSTM(1, 32, batch_first=True)
        self.bottleneck = nn.Linear(32, 8)
        self.dec = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, w))

    def forward(self, x):                                   # x: (B, T)
        _, (h, _) = self.enc(x[..., None])
        return self.dec(self.bottleneck(h[-1]))


@healthy("healthy_lstm_autoencoder_normal_only",
         "LSTM autoencoder for anomaly detection trained on normal vibration windows only, batches are 1-tuples "
         "(x,) and the criterion compares model(x) with x")
def healthy_lstm_autoencoder_normal_only():
    seed(0)
    x, xv = _normal_windows(2000, 331), _normal_windows(500, 332)
    model = LSTMAutoencoder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 1e-2),
                train_loader=loader(tds(x), 32), val_loader=loader(tds(xv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=200)


class QuantileForecaster(nn.Module):
    """Fixed (frozen on purpose) Fourier features of the known future hour-of-day plus a RevIN-style scaled window;
    three quantile heads, scaled back with the window's mean and std."""

    QS = (0.1, 0.5, 0.9)

    def __init__(self, w):
        super().__init__()
        self.fourier = nn.Linear(1, 6)
        with torch.no_grad():
            self.fourier.weight.copy_(2 * math.pi / 24 * torch.tensor([[1.0], [2.0], [3.0], [1.0], [2.0], [3.0]]))
            self.fourier.bias.copy_(torch.tensor([0.0, 0.0, 0.0, math.pi / 2, math.pi / 2, math.pi / 2]))
        self.fourier.requires_grad_(False)
        self.net = nn.Sequential(nn.Linear(w + 6, 64), nn.ReLU(), nn.Linear(64, 3))

    def forward(self, x, hour):
        mu, sd = x.mean(1, keepdim=True), x.std(1, keepdim=True) + 1e-3
        feats = torch.cat([(x - mu) / sd, torch.sin(self.fourier(hour[:, None].float()))], 1)
        return self.net(feats) * sd + mu


@healthy("healthy_quantile_frozen_fourier",
         "P10/P50/P90 forecaster with a multi-quantile pinball loss, frozen Fourier calendar features of the known "
         "future hour (frozen on purpose, left out of the optimizer) and RevIN-style scaling with its inverse")
def healthy_quantile_frozen_fourier():
    seed(0)

    def data(s, n):
        torch.manual_seed(s)
        t = torch.arange(n, dtype=torch.float32)
        v = 30 + 8 * torch.sin(2 * math.pi * t / 24) + torch.distributions.Exponential(0.5).sample((n,))
        x, y = windows(v, 24, 1)
        hour = (torch.arange(len(y)) + 24) % 24
        return x, hour, y
    x, hr, y = data(341, 3000)
    xv, hv, yv = data(342, 800)
    model = QuantileForecaster(24)
    qs = torch.tensor(QuantileForecaster.QS)

    def loss_fn(m, batch):
        xb, hb, yb = batch
        err = yb - m(xb, hb)                                   # (B, 3)
        q = qs.to(err.device)
        return torch.maximum(q * err, (q - 1) * err).mean()
    params = [p for p in model.parameters() if p.requires_grad]
    return dict(model=model, optimizer=torch.optim.Adam(params, 3e-3),
                train_loader=loader(tds(x, hr, y), 32), val_loader=loader(tds(xv, hv, yv), 256, shuffle=False),
                loss_fn=loss_fn, max_steps=200)
