"""Set aa, family shapes: a tensor that reaches the loss (or the next layer) with its axes in the wrong order or
with an extra axis, silently, in segmentation, keypoint, audio and sensor code."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aa.registry import (
    acc_of,
    balanced_pixel_acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    rect_scenes,
    rmse_of,
    seed,
)

# ------------------------------------------------------------------------------------------------------------------
# 1. Semantic segmentation: NCHW logits flattened with .view(-1, C) (the TF tutorial flattens NHWC tensors).
# ------------------------------------------------------------------------------------------------------------------

class TinyFCN(nn.Module):
    def __init__(self, classes: int = 3, in_ch: int = 3):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_ch, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, classes, 1),
        )

    def forward(self, x):
        return self.body(x)


@case("seg_logits_view_nchw", "shapes",
      bug="The per-pixel cross-entropy flattens the (N, C, H, W) segmentation logits with logits.view(-1, C) "
          "without first moving the class axis last (permute(0, 2, 3, 1)), so each 'pixel' row holds C neighbouring "
          "values of one class map and no longer lines up with mask.view(-1).",
      cause_pattern=r"permute\(0, ?2, ?3, ?1\)|movedim\(1, ?-1\)|class (axis|dim(ension)?|channel) (last|to the end)"
                    r"|channels?[- ]last|\bNHWC\b|view\(-1, ?(C|num_classes|n_classes|classes)\)"
                    r"|(logits|scores|outputs?) .{0,40}(flatten|view|reshape)\w* .{0,60}(NCHW|\(N, ?C, ?H, ?W\)|class axis)"
                    r"|(NCHW|\(N, ?C, ?H, ?W\)).{0,80}(flatten|view|reshape)"
                    r"|pixels?'? .{0,40}(scores|logits).{0,40}(misaligned|do(es)? not (line up|match)|scrambled|mixed)")
def seg_logits_view_nchw(fixed: bool = False):
    seed(0)
    x, m = rect_scenes(768, s=11)
    classes = 3
    model = TinyFCN(classes)

    def pixel_ce(model, batch):
        img, mask = batch
        logits = model(img)                                      # (N, C, H, W)
        if fixed:
            logits = logits.permute(0, 2, 3, 1)
        return F.cross_entropy(logits.reshape(-1, classes), mask.reshape(-1))

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:640], m[:640]), 32),
                val_loader=loader(TensorDataset(x[640:], m[640:]), 64, shuffle=False),
                loss_fn=pixel_ce, max_steps=2000)


fix("seg_logits_view_nchw", fixed_of(seg_logits_view_nchw),
    balanced_pixel_acc_of(lambda m, b: (m(b[0]).argmax(1), b[1]), 3), "val balanced pixel acc")


# ------------------------------------------------------------------------------------------------------------------
# 2. Keypoints by soft-argmax: the softmax normalises over the keypoint axis instead of over the heatmap pixels.
# ------------------------------------------------------------------------------------------------------------------

def dot_images(n: int, k: int = 3, size: int = 16, s: int = 0):
    """Keypoint k is a bright 2x2 dot in channel k; targets (n, k, 2) = (x, y) in [0, 1]."""
    g = gen(s)
    img = 0.4 * torch.randn(n, k, size, size, generator=g)
    pts = torch.randint(0, size - 1, (n, k, 2), generator=g)       # (col, row) of the dot's top-left
    for i in range(n):
        for j in range(k):
            c, r = pts[i, j].tolist()
            img[i, j, r:r + 2, c:c + 2] += 2.0
    return img, (pts.float() + 0.5) / (size - 1)


class HeatmapKeypoints(nn.Module):
    def __init__(self, k: int = 3, size: int = 16, spatial_softmax_dim: int = 1):
        super().__init__()
        self.heat = nn.Sequential(nn.Conv2d(k, 16, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, k, 1))
        ys, xs = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
        self.register_buffer("gx", xs.reshape(-1))
        self.register_buffer("gy", ys.reshape(-1))
        self.dim = spatial_softmax_dim

    def forward(self, x):
        h = self.heat(x).flatten(2)                              # (N, K, H*W)
        p = F.softmax(h * 4.0, dim=self.dim)
        return torch.stack([(p * self.gx).sum(-1), (p * self.gy).sum(-1)], dim=-1)   # (N, K, 2)


@case("keypoint_softargmax_axis", "shapes",
      bug="The soft-argmax keypoint head applies F.softmax(heatmaps.flatten(2), dim=1) to the (N, K, H*W) heatmaps, "
          "normalising across the K keypoints at each pixel instead of across the H*W pixels of each heatmap "
          "(dim=-1), so the 'expected coordinates' are sums over hundreds of pixels and cannot reach the targets.",
      cause_pattern=r"soft-?argmax|spatial softmax|softmax.{0,80}(over|across|along) (the )?(K |keypoints?|joints?)"
                    r"|softmax.{0,80}(pixels?|spatial|H ?\* ?W|heatmap)"
                    r"|(heatmaps?|pixels?).{0,60}(do not|don't|does not|doesn't) sum to (1|one)"
                    r"|expected coordinates?|dim ?= ?-1.{0,40}heatmap|heatmap.{0,40}dim ?= ?-1")
def keypoint_softargmax_axis(fixed: bool = False):
    seed(0)
    x, y = dot_images(704, s=12)
    model = HeatmapKeypoints(spatial_softmax_dim=-1 if fixed else 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:576], y[:576]), 32),
                val_loader=loader(TensorDataset(x[576:], y[576:]), 64, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1500)


fix("keypoint_softargmax_axis", fixed_of(keypoint_softargmax_axis),
    rmse_of(lambda m, b: (m(b[0]) * 15, b[1] * 15)), "val keypoint RMSE (px)", higher=False)


# ------------------------------------------------------------------------------------------------------------------
# 3. CRNN on log-mel spectrograms: conv maps (N, C, F, T) reshaped to (N, T, C*F) without moving time forward.
# ------------------------------------------------------------------------------------------------------------------

def sweep_spectrograms(n: int, f: int = 16, t: int = 48, s: int = 0):
    """Log-mel-like (n, 1, f, t): class 0 an up-sweep, 1 a down-sweep, 2 a low steady tone, 3 a high steady tone,
    12 frames long at a random onset."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    spec = 1.0 * torch.randn(n, 1, f, t, generator=g)
    for i in range(n):
        onset = int(torch.randint(0, t - 12, (1,), generator=g))
        for k in range(12):
            band = {0: 2 + k, 1: 13 - k, 2: 4, 3: 11}[int(y[i])]
            spec[i, 0, band, onset + k] += 2.0
    return spec, y


class CRNN(nn.Module):
    def __init__(self, classes: int = 4, permute_time: bool = False):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d((2, 1)))
        self.rnn = nn.GRU(8 * 8, 32, batch_first=True)
        self.head = nn.Linear(32, classes)
        self.permute_time = permute_time

    def forward(self, spec):
        x = self.conv(spec)                                     # (N, C, F', T)
        n, c, f, t = x.shape
        if self.permute_time:
            x = x.permute(0, 3, 1, 2)                           # (N, T, C, F')
        x = x.reshape(n, t, c * f)                              # the GRU wants (N, T, features)
        _, h = self.rnn(x)
        return self.head(h[-1])


@case("crnn_spectrogram_reshape", "shapes",
      bug="The CRNN turns its (N, C, F, T) conv feature maps into a GRU sequence with x.reshape(N, T, C * F) "
          "without permuting time to the front (x.permute(0, 3, 1, 2)), so the 'time steps' the GRU reads are "
          "frequency rows holding whole time profiles, not frames.",
      cause_pattern=r"permute\(0, ?3, ?1, ?2\)|(reshape|view)\w*\(N, ?T, ?(C ?\* ?F|-1)\).{0,80}(permute|transpose|time)"
                    r"|(reshape|view) (instead of|rather than|without) (a )?(permute|transpose)"
                    r"|(time|frames?) (axis|dim(ension)?) .{0,60}(not|never) (moved|permuted|first|leading)"
                    r"|(sequence|time) steps? .{0,60}(are|were) (not|n't) (time )?frames"
                    r"|(frequency|channel) (rows|axis) .{0,40}(treated|read|fed) as (time|the sequence)")
def crnn_spectrogram_reshape(fixed: bool = False):
    seed(0)
    x, y = sweep_spectrograms(512, s=13)
    model = CRNN(permute_time=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:256], y[:256]), 32),
                val_loader=loader(TensorDataset(x[256:], y[256:]), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("crnn_spectrogram_reshape", fixed_of(crnn_spectrogram_reshape),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val acc")


# ------------------------------------------------------------------------------------------------------------------
# 4. Bidirectional GRU on sensor windows: h_n (num_directions, N, H) flattened with .view(N, -1).
# ------------------------------------------------------------------------------------------------------------------

def sensor_windows(n: int, t: int = 48, s: int = 0):
    """(n, t, 3) IMU-like windows: channel 0 carries a sine whose frequency is the class (4), channels 1-2 noise."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    tt = torch.arange(t).float()
    x = 0.5 * torch.randn(n, t, 3, generator=g)
    phase = torch.rand(n, generator=g) * 2 * math.pi
    x[:, :, 0] += torch.sin(2 * math.pi * (y[:, None].float() + 1) / 16 * tt + phase[:, None])
    return x, y


class BiGRUClassifier(nn.Module):
    def __init__(self, classes: int = 4, hidden: int = 16, cat_directions: bool = False):
        super().__init__()
        self.gru = nn.GRU(3, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, classes)
        self.cat_directions = cat_directions

    def forward(self, x):
        _, h = self.gru(x)                                      # h: (2, N, hidden) even with batch_first=True
        if self.cat_directions:
            feats = torch.cat([h[0], h[1]], dim=1)
        else:
            feats = h.view(x.size(0), -1)                       # "(batch, 2 * hidden)"
        return self.head(feats)


@case("bigru_hidden_view", "shapes",
      bug="The bidirectional GRU's final state h_n has shape (num_directions, N, hidden) even with batch_first=True; "
          "h_n.view(N, -1) reinterprets it as (N, 2 * hidden), so row i is built from the states of other samples "
          "(2i and 2i + 1), not sample i's forward and backward states.",
      cause_pattern=r"h_?n\b.{0,80}(num_layers|num_directions|directions?|layers?)"
                    r"|(h_?n|hidden|final state).{0,60}(view|reshape)\w*\((N|batch|x\.size\(0\)|B), ?-1\)"
                    r"|torch\.cat\(\[?h(_n)?\[-?[02]\], ?h(_n)?\[-?1\]"
                    r"|(batch_first).{0,80}(not|doesn't|does not) (apply|affect)\w* .{0,20}(h_?n|hidden)"
                    r"|rows? .{0,60}other samples|mix(es|ing)? (states? )?(across|between) (samples|the batch)")
def bigru_hidden_view(fixed: bool = False):
    seed(0)
    x, y = sensor_windows(832, s=14)
    model = BiGRUClassifier(cat_directions=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:640], y[:640]), 32),
                val_loader=loader(TensorDataset(x[640:], y[640:]), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("bigru_hidden_view", fixed_of(bigru_hidden_view),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val acc")


# ------------------------------------------------------------------------------------------------------------------
# 5. HAR windows in Keras layout (N, T, C) fed to Conv1d with in_channels=T: it convolves across the 3 axes.
# ------------------------------------------------------------------------------------------------------------------

def burst_windows(n: int, t: int = 64, s: int = 0):
    """(n, t, 3) accelerometer windows, Keras layout: a 16-sample burst on all three axes at a random onset; the
    burst's frequency is the activity (4 classes)."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    tt = torch.arange(16).float()
    x = 0.6 * torch.randn(n, t, 3, generator=g)
    for i in range(n):
        onset = int(torch.randint(0, t - 16, (1,), generator=g))
        wave = torch.sin(2 * math.pi * (int(y[i]) + 1) / 12 * tt + float(torch.rand(1, generator=g)) * 6.28)
        x[i, onset:onset + 16] += wave[:, None] * torch.tensor([1.0, 0.6, 0.3])
    return x, y


class HARConvNet(nn.Module):
    def __init__(self, window: int = 64, axes: int = 3, channels_first: bool = False):
        super().__init__()
        self.channels_first = channels_first
        in_ch = axes if channels_first else window   # "expected input[32, 64, 3] to have 3 channels, but got 64"
        self.features = nn.Sequential(nn.Conv1d(in_ch, 32, 5, padding=2), nn.ReLU(),
                                      nn.Conv1d(32, 32, 5, padding=2), nn.ReLU(), nn.AdaptiveMaxPool1d(1))
        self.fc = nn.Linear(32, 4)

    def forward(self, x):                                       # x: (N, T, C) as the Keras code had it
        if self.channels_first:
            x = x.transpose(1, 2)                               # (N, C, T)
        return self.fc(self.features(x).flatten(1))


@case("conv1d_time_as_channels", "shapes",
      bug="The activity windows come in Keras layout (N, T=64, C=3); instead of transposing them to (N, C, T) for "
          "nn.Conv1d, the first conv was built with in_channels=64, so it treats the 64 time steps as channels and "
          "slides its kernel over the 3 sensor axes: no convolution over time, no shift invariance.",
      cause_pattern=r"in_channels ?= ?(64|T|window|seq(uence)?_len\w*)|transpose\(1, ?2\)|permute\(0, ?2, ?1\)"
                    r"|\(N, ?C, ?(T|L)\)|channels?[- ]first|(batch, ?channels?, ?(length|time|steps))"
                    r"|(time( steps?)?|sequence) .{0,40}(treated|used|read) as (the )?(input )?channels"
                    r"|convolv\w* (over|across|along) the (3 )?(sensor )?(axes|channels)( instead| rather)?")
def conv1d_time_as_channels(fixed: bool = False):
    seed(0)
    x, y = burst_windows(768, s=15)
    model = HARConvNet(channels_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:384], y[:384]), 32),
                val_loader=loader(TensorDataset(x[384:], y[384:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("conv1d_time_as_channels", fixed_of(conv1d_time_as_channels),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val acc")
