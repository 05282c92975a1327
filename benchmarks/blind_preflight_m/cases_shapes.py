"""Set m, family shapes: a tensor reaches a layer or a loss in a layout that runs but means something else."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_m.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------
# 1. Activity recognition from wrist sensors, Keras-style (batch, time, features) windows into an nn.GRU.
#    Source: https://theneuralbase.com/pytorch/learn/intermediate/input-shape-for-rnns-seq-batch-features/


def activity_windows(n, s):
    g = gen(s)
    t = torch.arange(24, dtype=torch.float32)
    y = torch.randint(0, 4, (n,), generator=g)
    freq = (y + 1).float()[:, None]
    phase = torch.rand(n, 1, generator=g) * 2 * math.pi
    amp = 0.8 + 0.4 * torch.rand(n, 1, generator=g)
    wave = amp * torch.sin(2 * math.pi * freq * t / 24 + phase)
    x = 0.3 * torch.randn(n, 24, 6, generator=g)
    x[:, :, 0] += wave
    x[:, :, 1] += 0.7 * wave
    x[:, :, 2] += amp * torch.cos(2 * math.pi * freq * t / 24 + phase)
    return x, y


class ActivityGRU(nn.Module):
    def __init__(self, batch_first):
        super().__init__()
        self.gru = nn.GRU(6, 32, batch_first=batch_first)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out[:, -1])      # "the last time step"


@case("shapes_gru_no_batch_first", "shapes",
      "nn.GRU is built without batch_first=True but is fed (batch, time, features) windows, so the recurrence runs "
      "over the batch axis and out[:, -1] is not each window's last time step.",
      r"batch_first|(time|seq\w*)[- ](major|first)|\((seq\w*|time|T|L)\w*, ?(batch|N|B)\b|recurren\w*.{0,30}"
      r"(over|across|along) the batch|batch (axis|dim\w*) (is )?(treated|read|used|interpreted) as (the )?(time|seq)")
def shapes_gru_no_batch_first(fixed=False):
    seed(0)
    x, y = activity_windows(1600, 1)
    model = ActivityGRU(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("shapes_gru_no_batch_first", fixed_of(shapes_gru_no_batch_first),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 2. Colour of a blob on satellite-like tiles; images kept as NumPy (N, H, W, C) and "made channels-first" with
#    reshape. Source: https://kiwix.lema.org/stackoverflow.com_en_all_2023-11/questions/48771529/cnn-why-is-the-image-matrix-transformed-to-channel-width-height


def blob_tiles(n, s):
    rng = np.random.default_rng(s)
    colours = np.array([[0.9, 0.1, 0.1], [0.1, 0.9, 0.1], [0.1, 0.1, 0.9], [0.9, 0.9, 0.1]], dtype=np.float32)
    y = rng.integers(0, 4, n)
    img = 0.45 + 0.08 * rng.standard_normal((n, 16, 16, 3)).astype(np.float32)
    for i in range(n):
        r, c = rng.integers(0, 12, 2)
        img[i, r:r + 4, c:c + 4, :] = colours[y[i]] + 0.05 * rng.standard_normal((4, 4, 3))
    return img.astype(np.float32), y


class TileCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc(self.features(x))


@case("shapes_hwc_reshape", "shapes",
      "NumPy images in (N, H, W, C) layout are turned into (N, C, H, W) with reshape() instead of permute(0, 3, 1, 2), "
      "which scrambles the pixels and interleaves the colour channels.",
      r"(reshape|view)\(?\)?.{0,60}(instead of|rather than|in place of)\W{0,3}.{0,20}(permute|transpose|moveaxis)"
      r"|(permute|transpose)\W{0,3}0, ?3, ?1, ?2|\(N, ?H, ?W, ?C\)|\bN?HWC\b|channels?[- ]last (images|arrays|numpy|layout)"
      r"|scrambl\w* (the )?(pixels|channels|image)|interleav\w* (the )?(colou?r )?channels|channel order is wrong"
      r"|channels?[- _]last (input|images?|data|arrays?|order)|reshape.{0,40}(does not|doesn't|won't|cannot) "
      r"(move|permute|transpose|reorder)")
def shapes_hwc_reshape(fixed=False):
    seed(0)
    img, y = blob_tiles(1500, 2)
    x = torch.from_numpy(img)
    x = x.permute(0, 3, 1, 2).contiguous() if fixed else x.reshape(-1, 3, 16, 16)   # "Conv2d wants N, C, H, W"
    y = torch.from_numpy(y).long()
    model = TileCNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1200)


fix("shapes_hwc_reshape", fixed_of(shapes_hwc_reshape), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 3. Day-ahead load forecaster, 12-step horizon; targets kept 3-D (N, 12, 1) from a Keras pipeline.
#    Source: https://stackguides.com/questions/51432661/time-series-keras-lstm-echoing-instead-of-predicting


def load_windows(n, s, lookback=48, horizon=12):
    g = gen(s)
    t0 = torch.rand(n, 1, generator=g) * 1000
    t = t0 + torch.arange(lookback + horizon, dtype=torch.float32)
    level = 1.0 + 0.3 * torch.randn(n, 1, generator=g)
    series = level + torch.sin(2 * math.pi * t / 24) + 0.4 * torch.sin(2 * math.pi * t / 7.5)
    series = series + 0.05 * torch.randn(series.shape, generator=g)
    return series[:, :lookback], series[:, lookback:]


@case("shapes_horizon_broadcast", "shapes",
      "Targets are stored as (N, 12, 1) while the forecaster outputs channels-first (N, 1, 12), so MSELoss "
      "broadcasts them to (N, 12, 12) and every forecast step is fit to every target step of the horizon.",
      r"12, ?1\)|1, ?12\)|\(\w+, ?12, ?12\)|12 ?x ?12|broadcast\w*.{0,60}horizon|horizon.{0,60}broadcast"
      r"|every (forecast )?step.{0,40}every (target|step)|trailing (singleton|size-1|unit) (dim|axis)")
def shapes_horizon_broadcast(fixed=False):
    seed(0)
    x, y = load_windows(2000, 3)
    y = y.unsqueeze(1) if fixed else y.unsqueeze(-1)          # Keras habit: "targets are (samples, steps, 1)"
    model = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 12),
                          nn.Unflatten(1, (1, 12)))           # (N, 1, 12): one channel, 12 steps, like a Conv1d head
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=2000)


fix("shapes_horizon_broadcast", fixed_of(shapes_horizon_broadcast), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE per step", higher=False)


# --------------------------------------------------------------------------------------------------------------
# 4. Heartbeat morphology from 8-lead windows (batch, time, leads); in_channels set to the time length to silence
#    the Conv1d error. Source: https://errorhandle.ai/convolutional-neural-network-conv1d-input-shape


def beat_windows(n, s):
    g = gen(s)
    t = torch.arange(96, dtype=torch.float32)
    y = torch.randint(0, 3, (n,), generator=g)
    centre = torch.randint(8, 88, (n, 1), generator=g).float()
    amp = 1.0 + torch.rand(n, 1, generator=g)
    sign = torch.where(torch.rand(n, 1, generator=g) < 0.5, -1.0, 1.0)
    narrow = torch.exp(-((t - centre) ** 2) / 2.0)
    wide = torch.exp(-((t - centre) ** 2) / 18.0)
    biphasic = torch.exp(-((t - centre + 2) ** 2) / 3.0) - torch.exp(-((t - centre - 2) ** 2) / 3.0)
    motif = torch.stack([narrow, wide, biphasic], 1)[torch.arange(n), y] * sign * amp
    x = 0.3 * torch.randn(n, 96, 8, generator=g)
    x[:, :, 0] += motif
    return x, y


class BeatNet(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        # the error said "expected input[32, 96, 8] to have 8 channels, but got 96 channels instead"
        first = nn.Conv1d(8, 32, 5, padding=2) if fixed else nn.Conv1d(96, 32, 5, padding=2)
        self.body = nn.Sequential(first, nn.ReLU(), nn.Conv1d(32, 32, 5, padding=2), nn.ReLU(),
                                  nn.AdaptiveMaxPool1d(1), nn.Flatten())
        self.out = nn.Linear(32, 3)

    def forward(self, x):
        if self.fixed:
            x = x.transpose(1, 2)
        return self.out(self.body(x))


@case("shapes_conv1d_time_as_channels", "shapes",
      "Windows in (batch, time, leads) layout go into nn.Conv1d with in_channels set to the 96 time steps, so the "
      "convolution slides over the 8 leads instead of over time.",
      r"in_channels\W{0,5}(=|is|of)?\W{0,3}96|conv\w*.{0,60}(slid\w*|run\w*|convolv\w*|mov\w*) (over|along|across)"
      r" (the )?(\d+ )?(leads|channels|features)|(time|sequence)( steps?| axis| dim\w*)? (are |is )?(used |treated |read )"
      r"?as (the )?(input )?channels|\(N, ?C, ?L\)|\((batch|N|B), ?(channels|C|leads), ?(time|L|length)\)"
      r"|transpose\(1, ?2\)|permute\(0, ?2, ?1\)")
def shapes_conv1d_time_as_channels(fixed=False):
    seed(0)
    x, y = beat_windows(1400, 4)
    model = BeatNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1000], y[:1000]), 32),
                val_loader=loader(TensorDataset(x[1000:], y[1000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("shapes_conv1d_time_as_channels", fixed_of(shapes_conv1d_time_as_channels),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# 5. Field / building segmentation, FCN logits flattened TF-style. Source:
#    http://ronny.rest/tutorials/module/seg_01/segmentation_04_training/


def field_tiles(n, s, size=24):
    g = gen(s)
    img = 0.1 * torch.randn(n, 3, size, size, generator=g) + 0.3
    mask = torch.zeros(n, size, size, dtype=torch.long)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    for i in range(n):
        r, c, h, w = torch.randint(0, 12, (4,), generator=g).tolist()
        rect = (yy >= r) & (yy < r + 4 + h // 2) & (xx >= c) & (xx < c + 4 + w // 2)
        cy, cx = torch.randint(4, size - 4, (2,), generator=g).tolist()
        disk = ((yy - cy) ** 2 + (xx - cx) ** 2) <= 9
        mask[i][rect] = 1
        mask[i][disk] = 2
    colour = torch.tensor([[0.0, 0.0, 0.0], [0.5, -0.1, -0.1], [-0.1, 0.5, 0.0]])
    img = img + colour[mask].permute(0, 3, 1, 2)
    return img, mask


def seg_loss_flat(model, batch):
    images, masks = batch
    logits = model(images)                                    # (N, 3, H, W)
    return F.cross_entropy(logits.view(-1, 3), masks.view(-1))


def seg_loss_permuted(model, batch):
    images, masks = batch
    logits = model(images)
    return F.cross_entropy(logits.permute(0, 2, 3, 1).reshape(-1, 3), masks.reshape(-1))


def fcn():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 3, 1))


@case("shapes_seg_view_nchw", "shapes",
      "The (N, C, H, W) segmentation logits are flattened with view(-1, C) without first moving the class axis last "
      "(permute(0, 2, 3, 1)), so each row mixes pixels of one class map and no longer lines up with mask.view(-1).",
      r"view\(-1, ?(C|3|num_classes|n_classes)\)|(without|before|no)\w* (first )?(a )?(permut|mov|transpos)\w*.{0,40}"
      r"class|class (axis|dim\w*|channel).{0,40}(last|permut|moved|transpos)|permute\(0, ?2, ?3, ?1\)|movedim"
      r"|(logits|predictions|rows).{0,40}(misalign|no longer (line|match)|out of order|scrambl|mix\w* (pixels|classes))")
def shapes_seg_view_nchw(fixed=False):
    seed(0)
    img, mask = field_tiles(900, 5)
    model = fcn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(img[:700], mask[:700]), 16),
                val_loader=loader(TensorDataset(img[700:], mask[700:]), 50, shuffle=False),
                loss_fn=seg_loss_permuted if fixed else seg_loss_flat, max_steps=1000)


fix("shapes_seg_view_nchw", fixed_of(shapes_seg_view_nchw), acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])),
    "val pixel accuracy")
