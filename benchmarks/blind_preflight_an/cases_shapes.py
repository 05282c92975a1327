"""Set an, family shapes: a tensor laid out, pooled or broadcast along the wrong axis, with no error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_an.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    seed,
)

# ----------------------------------------------------------------------------------------------------------------
# Segmentation logits (N, C, H, W) flattened with .view(-1, C) instead of a permute to channels-last first.


def seg_blobs(n: int, s: int, size: int = 16, classes: int = 3):
    """Grey images with 2-3 rectangles; class 1 rectangles bright, class 2 dark; the mask names the class."""
    g = gen(s)
    x = 0.3 * torch.randn(n, 1, size, size, generator=g)
    m = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        for _ in range(3):
            c = int(torch.randint(1, classes, (1,), generator=g))
            h0, w0 = (int(v) for v in torch.randint(0, size - 5, (2,), generator=g))
            hh, ww = (int(v) for v in torch.randint(3, 7, (2,), generator=g))
            m[i, h0:h0 + hh, w0:w0 + ww] = c
    x = x + (m == 1).float().unsqueeze(1) * 1.0 - (m == 2).float().unsqueeze(1) * 1.0
    return x, m


class TinyFCN(nn.Module):
    def __init__(self, classes: int = 3, width: int = 16):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(width, classes, 1))

    def forward(self, x):
        return self.body(x)


def seg_pixel_acc(model, kw):
    def fn(m, b):
        x, y = b
        dev = next(m.parameters()).device
        p = m(x.to(dev)).argmax(1).cpu()
        return (p == y).sum().item(), y.numel()
    return mean_over(model, kw["val_loader"], fn)


def build_seg_logits_view(fixed: bool = False) -> dict:
    seed(0)
    x, m = seg_blobs(1200, 1)
    model = TinyFCN()

    def seg_loss(model, batch):
        images, masks = batch
        logits = model(images)  # (N, 3, H, W)
        if fixed:
            flat = logits.permute(0, 2, 3, 1).reshape(-1, 3)
        else:
            flat = logits.view(-1, 3)  # "one row of class scores per pixel"
        return F.cross_entropy(flat, masks.reshape(-1))

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1000], m[:1000]), 32),
                val_loader=loader(TensorDataset(x[1000:], m[1000:]), 100, shuffle=False),
                loss_fn=seg_loss, max_steps=2000)


case("an_shapes_seg_logits_view", "shapes",
     "The segmentation loss flattens the (N, C, H, W) logits with logits.view(-1, C) instead of "
     "logits.permute(0, 2, 3, 1).reshape(-1, C), so each 'pixel row' of class scores is C neighbouring pixels of one "
     "channel and the targets mask.view(-1) are compared with scrambled logits.",
     r"permute\(0, ?2, ?3, ?1\)|view\(-1, ?(C|num_classes|3)\)|"
     r"(logits|outputs?|scores).{0,40}channels?[- ]last|channels?[- ]last.{0,40}(logits|scores|before (the )?(loss|cross))|"
     r"(class|channel) (dim|axis|dimension).{0,80}(flatten|view|reshape|permute|move|last)|"
     r"(flatten|view|reshape).{0,80}(class|channel) (dim|axis|dimension)|"
     r"(logits|scores).{0,60}(scrambl|misalign|interleav|mix).{0,40}(pixel|class|channel)")(build_seg_logits_view)
fix("an_shapes_seg_logits_view", fixed_of(build_seg_logits_view), seg_pixel_acc, "val pixel accuracy")


# ----------------------------------------------------------------------------------------------------------------
# Bidirectional 2-layer GRU: h_n (layers*dirs, N, H) flattened with .view(N, -1), mixing clips of the batch.

def band_bursts(n: int, s: int, t: int = 20, f: int = 8, classes: int = 4):
    g = gen(s)
    x = 0.5 * torch.randn(n, t, f, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    start = torch.randint(0, t - 5, (n,), generator=g)
    for i in range(n):
        band = int(y[i]) * 2
        x[i, start[i]:start[i] + 5, band:band + 2] += 1.5
    return x, y


class ClipGRU(nn.Module):
    def __init__(self, fixed: bool, f: int = 8, hidden: int = 24, classes: int = 4):
        super().__init__()
        self.fixed = fixed
        self.gru = nn.GRU(f, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(4 * hidden, classes)

    def forward(self, x):
        _, h_n = self.gru(x)  # (num_layers * 2, N, hidden)
        if self.fixed:
            feats = h_n.permute(1, 0, 2).reshape(x.size(0), -1)
        else:
            feats = h_n.view(x.size(0), -1)
        return self.head(feats)


def build_gru_hn_view(fixed: bool = False) -> dict:
    seed(0)
    x, y = band_bursts(1600, 2)
    model = ClipGRU(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1300], y[:1300]), 32),
                val_loader=loader(TensorDataset(x[1300:], y[1300:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


def _cls_fwd(m, b):
    dev = next(m.parameters()).device
    return m(b[0].to(dev)).argmax(-1).cpu(), b[1]


case("an_shapes_gru_hn_view", "shapes",
     "The bidirectional two-layer GRU's final hidden state h_n, shaped (num_layers * 2, N, hidden), is flattened with "
     "h_n.view(N, -1) instead of h_n.permute(1, 0, 2).reshape(N, -1), so each clip's feature row holds the hidden "
     "states of other clips in the batch.",
     r"h_n|h_?n\b|hidden state.{0,80}(view|reshape|permute|transpose|batch)|"
     r"(num_layers|layers) ?\* ?(num_directions|2|directions)|"
     r"(mix|mixes|mixing|interleav|scrambl|leak).{0,60}(samples|examples|clips|rows) (of|in|across) the batch|"
     r"batch (dimension|axis|dim) (is )?(not first|second|in the middle)|permute\(1, ?0, ?2\)")(build_gru_hn_view)
fix("an_shapes_gru_hn_view", fixed_of(build_gru_hn_view), acc_of(_cls_fwd), "val accuracy")


# ----------------------------------------------------------------------------------------------------------------
# Box regression with a hand-written L1: predictions (N, 4) against targets kept as (N, 1, 4) broadcast to (N, N, 4).

def one_box_images(n: int, s: int, size: int = 16):
    g = gen(s)
    x = 0.2 * torch.randn(n, 1, size, size, generator=g)
    boxes = torch.zeros(n, 1, 4)
    for i in range(n):
        w, h = (int(v) for v in torch.randint(3, 8, (2,), generator=g))
        x0 = int(torch.randint(0, size - w + 1, (1,), generator=g))
        y0 = int(torch.randint(0, size - h + 1, (1,), generator=g))
        x[i, 0, y0:y0 + h, x0:x0 + w] += 1.0
        boxes[i, 0] = torch.tensor([x0, y0, x0 + w, y0 + h], dtype=torch.float) / size
    return x, boxes


class BoxNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 16, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return self.head(self.features(x))


def build_box_l1_broadcast(fixed: bool = False) -> dict:
    seed(0)
    x, boxes = one_box_images(1500, 3)
    model = BoxNet()

    def box_l1(model, batch):
        images, target = batch  # target: (N, 1, 4), one box per image in the detection format
        pred = model(images)  # (N, 4)
        if fixed:
            pred = pred.unsqueeze(1)
        return (pred - target).abs().mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1200], boxes[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], boxes[1200:]), 100, shuffle=False),
                loss_fn=box_l1, max_steps=1000)


def box_mae(model, kw):
    def fn(m, b):
        dev = next(m.parameters()).device
        p = m(b[0].to(dev)).float().cpu()
        return (p - b[1][:, 0]).abs().sum().item(), p.numel()
    return mean_over(model, kw["val_loader"], fn)


case("an_shapes_box_l1_broadcast", "shapes",
     "The hand-written box L1 loss subtracts targets of shape (N, 1, 4) from predictions of shape (N, 4); "
     "broadcasting makes an (N, N, 4) difference, so every box is regressed towards every other image's box and "
     "the model learns the mean box.",
     r"\((N|\d+), ?(N|\d+), ?4\)|\[(N|\d+), ?(N|\d+), ?4\]|\((N|\d+), ?1, ?4\)|\[(N|\d+), ?1, ?4\]|"
     r"broadcast\w*.{0,80}(box|coordinates)|(box|coordinates).{0,80}broadcast|"
     r"every (other )?(image|sample)'?s? box|(the )?mean box")(build_box_l1_broadcast)
fix("an_shapes_box_l1_broadcast", fixed_of(build_box_l1_broadcast), box_mae, "val box MAE", higher=False)


# ----------------------------------------------------------------------------------------------------------------
# Channels-last uint8 images (N, H, W, 3) turned into (N, 3, H, W) with reshape instead of permute, into a CNN.

def hwc_shapes(n: int, s: int, size: int = 16):
    """HWC uint8-like arrays: a small patch of one colour family (red, green, blue, magenta) at a random place on a
    grey background; the class is the colour."""
    g = gen(s)
    img = torch.full((n, size, size, 3), 120.0) + 15 * torch.randn(n, size, size, 3, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    palette = torch.tensor([[220.0, 60, 60], [60, 220, 60], [60, 60, 220], [220, 60, 220]])
    for i in range(n):
        col = palette[int(y[i])] + 25 * torch.randn(3, generator=g)
        h, w = (int(v) for v in torch.randint(2, 5, (2,), generator=g))
        r, c = int(torch.randint(0, size - h, (1,), generator=g)), int(torch.randint(0, size - w, (1,), generator=g))
        img[i, r:r + h, c:c + w] = col
    return img.clamp(0, 255).round(), y


class ShapeCNN(nn.Module):
    def __init__(self, classes: int = 4):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(32, 32, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(self.features(x).amax(dim=(2, 3)))


def build_hwc_reshape(fixed: bool = False) -> dict:
    seed(0)
    raw, y = hwc_shapes(1600, 4)
    n = raw.shape[0]
    if fixed:
        pixels = raw.permute(0, 3, 1, 2) / 255.0
    else:
        pixels = raw.reshape(n, 3, 16, 16) / 255.0  # "HWC -> CHW"
    pixels = (pixels - 0.5) / 0.5
    model = ShapeCNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(pixels[:1300], y[:1300]), 32),
                val_loader=loader(TensorDataset(pixels[1300:], y[1300:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


case("an_shapes_hwc_reshape", "shapes",
     "The channels-last (N, H, W, 3) uint8 images are turned into (N, 3, H, W) with reshape instead of "
     "permute(0, 3, 1, 2), so the colour channels are interleaved into the rows and columns and the colour that names the class "
     "is smeared across positions.",
     r"permute\(0, ?3, ?1, ?2\)|\bN?HWC\b|channels?[- ]last|channels?[- ]first|\bCHW\b|"
     r"(image|pixel|input)s?.{0,60}(reshape|view)\w*.{0,60}(instead of|rather than|not).{0,20}(permute|transpose|movedim)|"
     r"(image|pixel|input)s?.{0,60}(permute|transpose|movedim).{0,40}(instead of|rather than|not).{0,20}(reshape|view)|"
     r"(colou?r )?channels? (are )?(interleav|scrambl|mixed into)")(build_hwc_reshape)
fix("an_shapes_hwc_reshape", fixed_of(build_hwc_reshape), acc_of(_cls_fwd), "val accuracy")


# ----------------------------------------------------------------------------------------------------------------
# Log-mel (N, mels, frames) pooled over the mel axis instead of time: the frequency that names the class is averaged away.

def tone_mels(n: int, s: int, mels: int = 32, frames: int = 32, classes: int = 4):
    g = gen(s)
    x = torch.randn(n, mels, frames, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    for i in range(n):
        band = 2 + int(y[i]) * 7 + int(torch.randint(0, 3, (1,), generator=g))
        t0 = int(torch.randint(0, frames - 10, (1,), generator=g))
        x[i, band:band + 2, t0:t0 + 10] += 2.5
    return x, y


class MelPoolNet(nn.Module):
    def __init__(self, fixed: bool, mels: int = 32, classes: int = 4):
        super().__init__()
        self.fixed = fixed
        self.mlp = nn.Sequential(nn.Linear(mels, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, x):  # (N, mels, frames)
        pooled = x.mean(dim=2) if self.fixed else x.mean(dim=1)  # "average over the clip"
        return self.mlp(pooled)


def build_mel_pool_axis(fixed: bool = False) -> dict:
    seed(0)
    x, y = tone_mels(1600, 5)
    model = MelPoolNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1300], y[:1300]), 32),
                val_loader=loader(TensorDataset(x[1300:], y[1300:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


case("an_shapes_mel_pool_axis", "shapes",
     "The clip classifier pools its (N, n_mels, frames) log-mel input with x.mean(dim=1), over the mel bins, instead "
     "of x.mean(dim=2) over time; square 32 x 32 crops keep the Linear's input size right, but the frequency band "
     "that names the class is averaged away.",
     r"mean\(dim ?= ?[12]\)|(pool|averag|mean|reduc)\w*.{0,60}(wrong|mel|frequency|freq) (axis|dim|dimension|bins)|"
     r"(over|across) (the )?(mel|frequency) (bins|axis)|(over|across) time|time (axis|dim|dimension)|"
     r"(wrong|unintended) (axis|dim|dimension)")(build_mel_pool_axis)
fix("an_shapes_mel_pool_axis", fixed_of(build_mel_pool_axis), acc_of(_cls_fwd), "val accuracy")
