"""Small pieces several of set bd's users share (the way a project keeps a utils.py): conv blocks, a tiny UNet, a
Cox partial likelihood and the survival / image loaders. Each case writes its own bug on top of these."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_bd import synth
from benchmarks.blind_preflight_bd.registry import loader


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class TinyUNet(nn.Module):
    def __init__(self, cin=3, n_classes=3, w=12):
        super().__init__()
        self.enc1 = block(cin, w)
        self.enc2 = block(w, 2 * w)
        self.up = nn.ConvTranspose2d(2 * w, w, 2, stride=2)
        self.dec = block(2 * w, w)
        self.head = nn.Conv2d(w, n_classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        d = self.dec(torch.cat([self.up(e2), e1], 1))
        return self.head(d)


class Backbone(nn.Module):
    """Stride-4 conv trunk for 32x32 inputs: (N, cin, 32, 32) -> (N, w, 8, 8)."""

    def __init__(self, cin=1, w=16):
        super().__init__()
        self.body = nn.Sequential(block(cin, w), nn.MaxPool2d(2), block(w, w), nn.MaxPool2d(2), block(w, w))

    def forward(self, x):
        return self.body(x)


class BoxRegressor(nn.Module):
    """Single-box regressor: 4 numbers in [0, 1] (normalised to the image size)."""

    def __init__(self, cin=1, w=16, size=32):
        super().__init__()
        self.backbone = Backbone(cin, w)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(w * (size // 4) ** 2, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return torch.sigmoid(self.head(self.backbone(x)))


class HeatmapNet(nn.Module):
    """CenterNet-style heatmap at stride 2 (16x16 for 32x32 inputs): (N, 1, 16, 16) logits."""

    def __init__(self, cin=1, w=16):
        super().__init__()
        self.body = nn.Sequential(block(cin, w), block(w, w), nn.MaxPool2d(2), block(w, w), block(w, w))
        self.hm = nn.Conv2d(w, 1, 1)
        nn.init.constant_(self.hm.bias, -2.19)

    def forward(self, x):
        return self.hm(self.body(x))


def risk_mlp(d=8, h=32):
    return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))


def cox_ph_loss(risk, time, event):
    """Negative Cox partial log-likelihood (Breslow, no ties), risk (N,), sorted here by time, descending."""
    order = torch.argsort(time, descending=True)
    risk, event = risk[order], event[order]
    log_risk_set = torch.logcumsumexp(risk, dim=0)
    return -((risk - log_risk_set) * event).sum() / event.sum().clamp(min=1.0)


def survival_loaders(n_train=1200, n_val=600, s=0, batch_size=64, censor_rate=0.5, censor_feature=None):
    """Train: (x, observed time, event); val: (x, true time, ones) so C-index is scored on the uncensored truth."""
    x, tt, e, _ = synth.survival_table(n_train, s=s, censor_rate=censor_rate, censor_feature=censor_feature)
    xv, _, _, tv = synth.survival_table(n_val, s=s + 1, censor_rate=censor_rate)
    train = loader(TensorDataset(synth.t(x), synth.t(tt), synth.t(e)), batch_size)
    val = loader(TensorDataset(synth.t(xv), synth.t(tv), torch.ones(n_val)), 200, shuffle=False)
    return train, val


def cox_loss_fn(model, batch):
    x, time, event = batch
    return cox_ph_loss(model(x).squeeze(-1), time, event)


def cox_fwd(model, batch):
    x, time, event = batch
    return model(x).squeeze(-1), time, event
