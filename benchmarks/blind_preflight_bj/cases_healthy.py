"""Healthy cases: five corrected twins of broken cases and five unusual but correct forecasting / detection setups."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_bj.cases_data import d_collate_sort_unpaired
from benchmarks.blind_preflight_bj.cases_mechanics import TCN, m_revin_no_denorm
from benchmarks.blind_preflight_bj.cases_shapes import s_gru_batch_first
from benchmarks.blind_preflight_bj.cases_targets import t_quantile_sign
from benchmarks.blind_preflight_bj.cases_trained import ae_loaders, anomaly_windows, w_shared_horizon_heads
from benchmarks.blind_preflight_bj.models import Seq2Seq, WindowAE
from benchmarks.blind_preflight_bj.registry import (gen, healthy, loaders, mlp, seed, series, time_split, twin,
                                                    windows)

for _builder, _text in [
    (s_gru_batch_first, "s_gru_batch_first with batch_first=True."),
    (t_quantile_sign, "t_quantile_sign with the pinball error y - pred."),
    (w_shared_horizon_heads, "w_shared_horizon_heads with one Linear per horizon step."),
    (m_revin_no_denorm, "m_revin_no_denorm with the forecast denormalised (out * std + mean)."),
    (d_collate_sort_unpaired, "d_collate_sort_unpaired with the targets sorted with their series."),
]:
    healthy(_builder.__name__ + "_fixed", "Corrected twin: " + _text)(twin(_builder))

L = 24


class SeasonalResidual(nn.Module):
    """Forecast = seasonal-naive (value one period back) + a learned residual correction."""

    def __init__(self, period=12, H=6):
        super().__init__()
        self.period, self.H = period, H
        self.net = mlp(L, H)

    def forward(self, x):
        naive = x[:, L - self.period:L - self.period + self.H]
        return naive + self.net(x - x.mean(1, keepdim=True))


@healthy("h_seasonal_naive_residual", "An MLP that learns only the residual over a seasonal-naive forecast.")
def h_seasonal_naive_residual():
    seed(50)
    tr, va = time_split(series(s=50, noise=0.2))
    model = SeasonalResidual()
    tl, vl = loaders(windows(tr, L, 6), windows(va, L, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=nn.L1Loss(), val_loader=vl)


@healthy("h_dilated_tcn", "A causal dilated TCN (left padding trimmed at the end) forecasting a 3-step horizon.")
def h_dilated_tcn():
    seed(51)
    tr, va = time_split(series(s=51))
    model = TCN(trim_end=True)
    tl, vl = loaders(windows(tr, 32, 3), windows(va, 32, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


def masked_recon_loss(model, batch):
    """Masked-imputation pretext: hide ~15% of the steps (value 0 plus a mask channel), score only the hidden ones."""
    x = batch[0]
    m = (torch.rand(x.shape) < 0.15).float()
    pred = model(torch.cat([x * (1 - m), m], 1))
    return ((pred - x) ** 2 * m).sum() / m.sum().clamp_min(1.0)


@healthy("h_masked_imputation", "Masked-value imputation training: the loss covers only randomly hidden steps, the "
                                "mask is fed as a second input channel.")
def h_masked_imputation():
    seed(52)
    from torch.utils.data import TensorDataset
    from benchmarks.blind_preflight_bj.registry import loader
    tr, va = time_split(series(s=52))
    xt, _ = windows(tr, L, 1)
    xv, _ = windows(va, L, 1)
    model = mlp(2 * L, L)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3),
                train_loader=loader(TensorDataset(xt), 32, shuffle=True), loss_fn=masked_recon_loss,
                val_loader=loader(TensorDataset(xv), 128, shuffle=False))


def scheduled_tf_loss(model, batch):
    """Teacher forcing with the decoder input shifted right by one step (last observed value first)."""
    x, y = batch
    dec_in = torch.cat([x[:, -1:], y[:, :-1]], dim=1)
    return ((model.teacher(x, dec_in) - y) ** 2).mean()


@healthy("h_seq2seq_teacher_forcing", "A GRU encoder-decoder trained with correctly shifted teacher forcing and "
                                      "decoded autoregressively at evaluation.")
def h_seq2seq_teacher_forcing():
    seed(53)
    tr, va = time_split(series(s=53))
    model = Seq2Seq(6)
    tl, vl = loaders(windows(tr, L, 6), windows(va, L, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tl,
                loss_fn=scheduled_tf_loss, val_loader=vl)


@healthy("h_ae_clean_windows", "A window autoencoder trained on normal windows only (unsupervised, (x,) batches with a "
                               "reconstruction criterion), evaluated by reconstruction-error AUROC.")
def h_ae_clean_windows():
    seed(54)
    tr, tr_lab, va, lab = anomaly_windows(54, contaminate=0.0)
    model = WindowAE(32)
    tl, vl = ae_loaders(tr, va, lab)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)
