"""Shapes: axis order and layout bugs in vision code (channels-last images, dense-head outputs, PIL sizes,
segmentation logits, softmax axes)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_u.registry import acc_of, case, fix, fixed_of, loader, on_truth, rng, seed

COLORS = np.array([[220, 40, 40], [40, 200, 60], [50, 60, 230]], dtype=np.float32)


# --- 1. channels-last camera frames reshaped (not permuted) to NCHW --------------------------------------------------

def _color_side_frames(n, s):
    r = rng(s)
    imgs = np.clip(r.normal(110, 18, (n, 16, 16, 3)), 0, 255)
    labels = np.zeros(n, dtype=np.int64)
    for i in range(n):
        c, bar = r.integers(3), r.integers(2)
        hh, ww = (2, 7) if bar else (4, 4)
        x, y = r.integers(0, 17 - ww), r.integers(0, 17 - hh)
        imgs[i, y:y + hh, x:x + ww] = COLORS[c] + r.normal(0, 10, 3)
        labels[i] = 2 * c + bar
    return imgs.astype(np.uint8), labels


class GripperNet(nn.Module):
    """Which part is on the tray (colour x square/bar): frames come from the camera driver as (N, H, W, 3) uint8."""

    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1))
        self.fc = nn.Linear(32, 6)

    def forward(self, frames):
        x = frames.float() / 255.0
        n, h, w, c = x.shape
        if self.fixed:
            x = x.permute(0, 3, 1, 2)
        else:
            x = x.reshape(n, c, h, w)   # "Conv2d wants (N, C, H, W)"
        return self.fc(self.features(x).flatten(1))


@case("gripper_frames_reshaped_not_permuted", "shapes",
      bug="Channels-last (N, H, W, 3) uint8 camera frames are turned into NCHW with x.reshape(n, c, h, w) instead of "
          "x.permute(0, 3, 1, 2), so every 'channel plane' the Conv2d sees is a scrambled strip of interleaved RGB "
          "pixels and the colour/shape layout is destroyed.",
      cause_pattern=r"(reshape|view)\b.{0,80}(permute|channels?[- ]last|\bHWC\b|NHWC|H, ?W, ?C|interleav|scrambl)"
                    r"|(permute|transpose)\(0, ?3, ?1, ?2\).{0,60}(instead|not|rather)"
                    r"|channels?[- ]last.{0,80}(reshape|view)|HWC.{0,60}(CHW|channels?[- ]first).{0,60}(reshape|view)")
def gripper_frames(fixed=False):
    seed(0)
    xtr, ytr = _color_side_frames(1200, 1)
    xva, yva = _color_side_frames(400, 2)
    model = GripperNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(torch.from_numpy(xtr), torch.from_numpy(ytr)), 32),
                val_loader=loader(TensorDataset(torch.from_numpy(xva), torch.from_numpy(yva)), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("gripper_frames_reshaped_not_permuted", fixed_of(gripper_frames),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --- 2. SSD-style dense head: (N, A*C, H, W) viewed as (N, -1, C) without moving the channels last -------------------

A, C = 2, 3


def _cell_grids(n, s):
    """8x8 grid of cells, two anchors per cell; anchor 0's class is coded by hue, anchor 1's by brightness of a
    third channel (2x2 pixels per cell)."""
    r = rng(s)
    l0, l1 = r.integers(0, C, (n, 8, 8)), r.integers(0, C, (n, 8, 8))
    img = np.stack([(l0 == 1), (l0 == 2), l1 / 2.0], 1).astype(np.float32)
    img = img.repeat(2, 2).repeat(2, 3) + r.normal(0, 0.25, (n, 3, 16, 16)).astype(np.float32)
    target = np.stack([l0, l1], -1).reshape(n, -1)        # ordered (h, w, anchor)
    return torch.from_numpy(img), torch.from_numpy(target).long()


class TinySSDHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(32, 32, 2, stride=2), nn.ReLU())
        self.cls = nn.Conv2d(32, A * C, 1)

    def forward(self, x):
        return self.cls(self.body(x))            # (N, A*C, 8, 8)


def _ssd_logits(out, fixed):
    n = out.shape[0]
    if fixed:
        return out.permute(0, 2, 3, 1).reshape(n, -1, C)
    return out.view(n, -1, C)                    # (N, H*W*A, C), or so it looks


def ssd_loss(fixed):
    def loss_fn(model, batch):
        x, y = batch
        logits = _ssd_logits(model(x), fixed)
        return F.cross_entropy(logits.reshape(-1, C), y.reshape(-1))
    return loss_fn


@case("ssd_head_view_without_permute", "shapes",
      bug="The anchor classification head outputs (N, A*C, H, W) and the loss reads it with out.view(N, -1, C) without "
          "out.permute(0, 2, 3, 1) first, so the C scores taken for cell (h, w, anchor a) come from other channels and "
          "far-away cells; they no longer line up with the (h, w, anchor) ordered targets.",
      cause_pattern=r"permute\(0, ?2, ?3, ?1\)|(view|reshape).{0,80}(anchors?|A ?\* ?C|num_anchors)"
                    r"|anchors?.{0,60}(order|layout|interleav|misalign)|(A ?\* ?C|channel).{0,60}(before|without).{0,20}"
                    r"permut")
def ssd_head(fixed=False):
    seed(0)
    xtr, ytr = _cell_grids(1000, 3)
    xva, yva = _cell_grids(300, 4)
    model = TinySSDHead()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xtr, ytr), 32),
                val_loader=loader(TensorDataset(xva, yva), 100, shuffle=False),
                loss_fn=ssd_loss(fixed), max_steps=300)


fix("ssd_head_view_without_permute", fixed_of(ssd_head),
    acc_of(lambda m, b: (_ssd_logits(m(b[0]), True).argmax(-1), b[1])), "val cell accuracy")


# --- 3. PIL's img.size unpacked as (h, w) when normalising box centres -----------------------------------------------

class DashcamCrops(Dataset):
    """Mixed portrait and landscape crops (PIL), each resized to 16x16 for the net; target: the blob's centre as a
    fraction of the crop's width and height."""

    def __init__(self, n, s, fixed):
        r = rng(s)
        self.fixed = fixed
        self.pil, self.small, self.truth = [], [], []
        for _ in range(n):
            hh, ww = ((16, 32), (32, 16))[r.integers(2)]
            img = Image.new("L", (ww, hh), 60)
            cx, cy = r.uniform(4, ww - 4), r.uniform(4, hh - 4)
            rx, ry = r.uniform(1.5, 7), r.uniform(1.5, 7)
            ImageDraw.Draw(img).ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=210)
            self.pil.append(img)
            self.small.append(np.asarray(img.resize((16, 16), Image.BILINEAR), np.float32) / 255.0)
            self.truth.append((cx / ww, cy / hh))
        self.small = torch.from_numpy(np.stack(self.small))[:, None]
        self.truth = torch.tensor(self.truth, dtype=torch.float32)
        self.centres = [(t[0].item() * p.size[0], t[1].item() * p.size[1]) for t, p in zip(self.truth, self.pil)]

    def __len__(self):
        return len(self.pil)

    def __getitem__(self, i):
        img = self.pil[i]
        if self.fixed:
            w, h = img.size
        else:
            h, w = img.size                     # numpy habit: shape is (h, w)
        cx, cy = self.centres[i]
        return self.small[i], torch.tensor([cx / w, cy / h], dtype=torch.float32)


def _blob_net():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 16, 64), nn.ReLU(), nn.Linear(64, 2))


@case("pil_size_unpacked_as_h_w", "shapes",
      bug="The box-centre targets are normalised with `h, w = img.size`, but PIL's Image.size is (width, height): on "
          "the portrait and landscape crops x is divided by the height and y by the width, so the same blob position "
          "gets targets that differ by 2x or 0.5x depending on an aspect ratio the resized input no longer shows.",
      cause_pattern=r"\.size.{0,60}\(w(idth)?, ?h(eight)?\)|(h, ?w|height, ?width) ?= ?\w*\.size"
                    r"|PIL.{0,60}(\(w(idth)?, ?h(eight)?\)|width.{0,10}height)|(width|height).{0,40}swapped"
                    r"|normali[sz]\w*.{0,60}(wrong|swapped) (dimension|axis|side)")
def pil_size(fixed=False):
    seed(0)
    model = _blob_net()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(DashcamCrops(1000, 5, fixed), 32),
                val_loader=loader(DashcamCrops(300, 6, fixed), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


def centre_rmse(model, kw):
    ds = kw["val_loader"].dataset
    pred = on_truth(model, ds.small, lambda m, x: m(x))
    return ((pred - ds.truth) ** 2).mean().sqrt().item()


fix("pil_size_unpacked_as_h_w", fixed_of(pil_size), centre_rmse, "val centre RMSE (true fractions)", higher=False)


# --- 4. segmentation logits flattened with transpose(1, 3) -----------------------------------------------------------

def _bar_scenes(n, s):
    """Road-marking scenes: horizontal bars of two classes on asphalt."""
    r = rng(s)
    img = r.normal(0.3, 0.08, (n, 3, 16, 16)).astype(np.float32)
    mask = np.zeros((n, 16, 16), dtype=np.int64)
    hue = np.array([[0.9, 0.9, 0.2], [0.95, 0.95, 0.95]], dtype=np.float32)
    for i in range(n):
        for _ in range(r.integers(1, 4)):
            k, y, x = r.integers(2), r.integers(0, 14), r.integers(0, 8)
            ln, th = r.integers(6, 15), r.integers(1, 3)
            mask[i, y:y + th, x:x + ln] = k + 1
            img[i, :, y:y + th, x:x + ln] = hue[k][:, None, None] + r.normal(0, 0.05, (3, 1, 1))
    return torch.from_numpy(img), torch.from_numpy(mask)


def _lane_fcn():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 3, 1))


def seg_flat_loss(fixed):
    def loss_fn(model, batch):
        x, mask = batch
        logits = model(x)
        c = logits.shape[1]
        if fixed:
            flat = logits.permute(0, 2, 3, 1).reshape(-1, c)
        else:
            flat = logits.transpose(1, 3).reshape(-1, c)       # "move classes last"
        return F.cross_entropy(flat, mask.reshape(-1))
    return loss_fn


@case("lane_logits_transpose_1_3", "shapes",
      bug="The lane-marking loss flattens the (B, C, H, W) logits with logits.transpose(1, 3).reshape(-1, C), which is "
          "(B, W, H, C) order, while the mask is flattened as (B, H, W): pixel (h, w) is scored against the label of "
          "pixel (w, h), i.e. against the transposed mask.",
      cause_pattern=r"transpose\(1, ?3\)|\(B, ?W, ?H, ?C\)|(H|height) and (W|width).{0,20}swapped"
                    r"|transpos\w*.{0,60}(mask|pixel|spatial)|permute\(0, ?2, ?3, ?1\).{0,60}(instead|not|rather)")
def lane_logits(fixed=False):
    seed(0)
    xtr, mtr = _bar_scenes(800, 7)
    xva, mva = _bar_scenes(200, 8)
    model = _lane_fcn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xtr, mtr), 16),
                val_loader=loader(TensorDataset(xva, mva), 50, shuffle=False),
                loss_fn=seg_flat_loss(fixed), max_steps=300)


pixel_acc = acc_of(lambda m, b: (m(b[0]).argmax(1), b[1]))
fix("lane_logits_transpose_1_3", fixed_of(lane_logits), pixel_acc, "val pixel accuracy")


# --- 5. Keras habit: softmax over the last axis of (N, C, H, W) in a Dice loss ---------------------------------------

def _cell_slides(n, s):
    """Stained-slide crops: nuclei (class 1) and cytoplasm blobs (class 2) on a pale background."""
    r = rng(s)
    img = r.normal(0.85, 0.05, (n, 3, 16, 16)).astype(np.float32)
    mask = np.zeros((n, 16, 16), dtype=np.int64)
    yy, xx = np.mgrid[:16, :16]
    tint = np.array([[0.35, 0.2, 0.6], [0.9, 0.5, 0.7]], dtype=np.float32)
    for i in range(n):
        for k in (1, 0, 0):
            cy, cx, rad = r.uniform(2, 14), r.uniform(2, 14), r.uniform(1.5, 4)
            blob = (yy - cy) ** 2 + (xx - cx) ** 2 < rad ** 2
            mask[i][blob] = k + 1
            img[i][:, blob] = tint[k][:, None] + r.normal(0, 0.05, (3, 1))
    return torch.from_numpy(img), torch.from_numpy(mask)


def dice_loss(fixed):
    def loss_fn(model, batch):
        x, mask = batch
        logits = model(x)
        probs = F.softmax(logits, dim=1 if fixed else -1)      # Keras: activation="softmax" (axis=-1)
        onehot = F.one_hot(mask, logits.shape[1]).permute(0, 3, 1, 2).to(probs.dtype)
        inter = (probs * onehot).sum((0, 2, 3))
        denom = probs.sum((0, 2, 3)) + onehot.sum((0, 2, 3))
        return 1 - ((2 * inter + 1) / (denom + 1)).mean()
    return loss_fn


@case("slide_dice_softmax_last_axis", "shapes",
      bug="The soft-Dice loss of the slide segmenter applies F.softmax(logits, dim=-1) (Keras' channels-last default) "
          "to (N, C, H, W) logits, so the probabilities are normalised across the image width instead of across the "
          "classes at each pixel; the class scores at a pixel are never made to compete.",
      cause_pattern=r"softmax.{0,60}(dim ?= ?-1|last (dim|axis)|width|axis ?= ?-1)|(dim|axis) ?= ?-1.{0,60}softmax"
                    r"|softmax.{0,80}(class|channel) (dim|axis)|normali[sz]ed (across|over) (the )?(image )?width")
def slide_dice(fixed=False):
    seed(0)
    xtr, mtr = _cell_slides(800, 9)
    xva, mva = _cell_slides(200, 10)
    model = _lane_fcn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xtr, mtr), 16),
                val_loader=loader(TensorDataset(xva, mva), 50, shuffle=False),
                loss_fn=dice_loss(fixed), max_steps=300)


fix("slide_dice_softmax_last_axis", fixed_of(slide_dice), pixel_acc, "val pixel accuracy")
