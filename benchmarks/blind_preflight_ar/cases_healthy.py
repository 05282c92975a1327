"""Set ar, healthy cases: five corrected twins of broken cases and five unusual but correct signal setups."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ar.cases_data import sed_labels_at_other_hop
from benchmarks.blind_preflight_ar.cases_mechanics import rnn_cell_loop_detaches_each_step
from benchmarks.blind_preflight_ar.cases_shapes import accel_view_instead_of_permute, har_lstm_without_batch_first
from benchmarks.blind_preflight_ar.cases_targets import har_window_label_not_strided
from benchmarks.blind_preflight_ar.cases_trained import WindowAE, _sensor_windows
from benchmarks.blind_preflight_ar.registry import (
    gen,
    healthy,
    loader,
    log_mel,
    seed,
    sine_series,
    twin,
)

healthy("har_lstm_batch_first_fixed", "Twin of har_lstm_without_batch_first: nn.LSTM(batch_first=True) on "
        "(batch, time, channels) windows.")(twin(har_lstm_without_batch_first))
healthy("accel_transpose_fixed", "Twin of accel_view_instead_of_permute: x.transpose(1, 2) to Conv1d's "
        "(batch, channels, time).")(twin(accel_view_instead_of_permute))
healthy("har_window_centre_label_fixed", "Twin of har_window_label_not_strided: window k labelled with "
        "labels[k * stride + window // 2].")(twin(har_window_label_not_strided))
healthy("sed_labels_resampled_fixed", "Twin of sed_labels_at_other_hop: 10 ms frame labels resampled to the "
        "20 ms feature hop with labels[:, ::2].")(twin(sed_labels_at_other_hop))
healthy("rnn_cell_full_bptt_fixed", "Twin of rnn_cell_loop_detaches_each_step: the GRUCell loop without "
        "per-step detach.")(twin(rnn_cell_loop_detaches_each_step))


def _events(n, s, F_=16, T=48, n_classes=3):
    """Sound-event detection: per-frame labels (0 = background, 1..2 = event types), clips of varying length with
    -100 on the padded frames."""
    g = gen(s)
    x = 0.5 * torch.randn(n, F_, T, generator=g)
    y = torch.zeros(n, T, dtype=torch.long)
    for i in range(n):
        L = int(torch.randint(24, T + 1, (1,), generator=g))
        for _ in range(2):
            c = int(torch.randint(1, n_classes, (1,), generator=g))
            start = int(torch.randint(0, L - 8, (1,), generator=g))
            dur = int(torch.randint(4, 9, (1,), generator=g))
            band = slice(2, 6) if c == 1 else slice(9, 13)
            x[i, band, start:start + dur] += 1.5
            y[i, start:start + dur] = c
        x[i, :, L:] = 0.0
        y[i, L:] = -100
    return x, y


@healthy("sed_framewise_ce_channels_first", "Sound-event detection: a Conv1d over (batch, mel, frames) returns "
         "(batch, classes, frames) logits for nn.CrossEntropyLoss with per-frame (batch, frames) targets and -100 on "
         "padded frames.")
def sed_framewise_ce_channels_first():
    seed(0)
    x, y = _events(800, s=61)
    model = nn.Sequential(nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(), nn.Conv1d(32, 32, 5, padding=2), nn.ReLU(),
                          nn.Conv1d(32, 3, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:700], y[:700]), 32),
                loss_fn=nn.CrossEntropyLoss(ignore_index=-100),
                val_loader=loader(TensorDataset(x[700:], y[700:]), 100, shuffle=False), max_steps=300)


@healthy("frozen_frontend_gru_onecycle", "Keyword spotting: a frozen 'pretrained' Conv1d front-end (requires_grad "
         "False, left out of the optimizer), a trainable GRU and head, OneCycleLR stepped per batch, clipping at 1.0.")
def frozen_frontend_gru_onecycle():
    seed(0)
    x, y = log_mel(1400, s=62)

    class KWS(nn.Module):
        def __init__(self):
            super().__init__()
            self.frontend = nn.Sequential(nn.Conv1d(16, 24, 3, padding=1), nn.ReLU())
            self.gru = nn.GRU(24, 32, batch_first=True)
            self.head = nn.Linear(32, 5)

        def forward(self, x):                    # (B, mel, frames)
            z = self.frontend(x).transpose(1, 2)
            return self.head(self.gru(z)[1][-1])

    model = KWS()
    model.frontend.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, weight_decay=1e-2)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=5e-3, total_steps=300)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, clip_grad_norm=1.0,
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 64), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 200, shuffle=False), max_steps=300)


@healthy("sensor_ae_l1_bf16_unlabelled", "Anomaly detection: an autoencoder on unlabelled 1-tuple batches of sensor "
         "windows, L1 reconstruction loss through a loss_fn(model, batch) callable, bf16 precision.")
def sensor_ae_l1_bf16_unlabelled():
    seed(0)
    x = _sensor_windows(1500, s=63)
    model = WindowAE()

    def recon_l1(m, batch):
        (w,) = batch
        return F.l1_loss(m(w).float(), w)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1200]), 64), loss_fn=recon_l1,
                val_loader=loader(TensorDataset(x[1200:]), 300, shuffle=False), precision="bf16", max_steps=300)


QUANTILES = (0.1, 0.5, 0.9)


@healthy("quantile_forecast_accumulation", "Probabilistic forecasting: an MLP predicting (batch, horizon, 3) "
         "quantiles trained with a pinball loss, 2-step gradient accumulation, clipping, AdamW and cosine decay.")
def quantile_forecast_accumulation():
    seed(0)
    s = sine_series(40, 150, s=64, noise=0.2)
    u = s.unfold(1, 32, 2).reshape(-1, 32)
    x, y = u[:, :24].contiguous(), u[:, 24:].contiguous()
    n = int(0.8 * len(x))

    class QuantileMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 8 * 3))

        def forward(self, x):
            return self.net(x).view(-1, 8, 3)

    def pinball(m, batch):
        inp, target = batch
        q = torch.tensor(QUANTILES, device=inp.device)
        err = target.unsqueeze(-1) - m(inp)
        return torch.maximum(q * err, (q - 1) * err).mean()

    model = QuantileMLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=300),
                accumulation_steps=2, clip_grad_norm=1.0,
                train_loader=loader(TensorDataset(x[:n], y[:n]), 32), loss_fn=pinball,
                val_loader=loader(TensorDataset(x[n:], y[n:]), 256, shuffle=False), max_steps=300)


_MASK_RNG = torch.Generator().manual_seed(65)


def _specaugment_collate(items):
    g = _MASK_RNG
    x = torch.stack([it[0] for it in items]).unsqueeze(1).clone()    # (B, 1, mel, frames)
    y = torch.stack([it[1] for it in items])
    for i in range(len(x)):
        f0 = int(torch.randint(0, 13, (1,), generator=g))
        t0 = int(torch.randint(0, 26, (1,), generator=g))
        x[i, :, f0:f0 + 3] = 0.0
        x[i, :, :, t0:t0 + 6] = 0.0
    return x, y


@healthy("logmel_cnn2d_specaugment", "Audio classification: a 2-D CNN over (batch, 1, mel, frames) log-mel patches "
         "with SpecAugment time / frequency masks in the collate, label smoothing 0.1, Nesterov SGD and a StepLR "
         "counted in optimizer steps.")
def logmel_cnn2d_specaugment():
    seed(0)
    x, y = log_mel(1400, s=66)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d((4, 1)), nn.Flatten(), nn.Linear(64, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    val = TensorDataset(x[1200:].unsqueeze(1), y[1200:])
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=150, gamma=0.3),
                train_loader=loader(list(zip(x[:1200], y[:1200])), 64, collate_fn=_specaugment_collate),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1),
                val_loader=loader(val, 200, shuffle=False), max_steps=300)
