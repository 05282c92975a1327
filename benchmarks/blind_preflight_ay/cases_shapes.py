"""Shapes: layouts, broadcasting and the dimension an op runs over, in hand-written image pipelines."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from benchmarks.blind_preflight_ay.registry import (
    SmallCNN,
    acc_of,
    case,
    colour_blobs,
    dots,
    fix,
    fixed_of,
    loader,
    rmse_of,
    seed,
    tensor_loaders,
    to_chw,
    val_acc,
    val_nll,
)


class FlipDataset(Dataset):
    """uint8 HWC images with a random horizontal flip written by hand in NumPy, then ToTensor-style conversion."""

    def __init__(self, img, y, fixed, train=True):
        self.img, self.y, self.fixed, self.train = img, y, fixed, train
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        im = self.img[i]
        if self.train and self.rng.random() < 0.5:
            im = np.flip(im, axis=1) if self.fixed else np.flip(im, axis=-1)
        x = torch.from_numpy(np.ascontiguousarray(im)).permute(2, 0, 1).float().div(255)
        return x, int(self.y[i])


@case("hflip_wrong_axis", "shapes",
      "The hand-written horizontal flip on an HWC NumPy image uses np.flip(img, axis=-1), which reverses the channel "
      "axis (RGB <-> BGR) instead of the width axis (axis=1): half the training images have red and blue swapped "
      "while keeping their colour label.",
      r"np\.flip|flip.{0,60}(axis|dim|channel)|(axis|dim) ?= ?-1|(axis|dim) ?= ?1|channel (axis|dim|order)|"
      r"RGB.{0,20}BGR|BGR.{0,20}RGB|swap.{0,30}(red|blue|channel)|(red|blue).{0,30}swap")
def hflip_wrong_axis(fixed=False):
    seed(0)
    img, y = colour_blobs(1600, s=1)
    model = SmallCNN(4)
    tr = loader(FlipDataset(img[:1200], y[:1200], fixed), 32)
    va = loader(FlipDataset(img[1200:], y[1200:], fixed, train=False), 128, shuffle=False)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("hflip_wrong_axis", fixed_of(hflip_wrong_axis), val_nll, "val NLL", higher=False)


@case("count_head_broadcast", "shapes",
      "The counting head outputs (50, 1) and the dot counts are (50,): nn.MSELoss broadcasts them to (50, 50), so every "
      "image is pulled towards every count in the batch and the head predicts the batch mean.",
      r"\(50, ?50\)|\(50, ?1\).{0,40}\(50,?\)|\(N, ?N\)|\(N, ?1\).{0,40}\(N,?\)|\(N,?\).{0,40}\(N, ?1\)|"
      r"MSELoss.{0,60}broadcast|broadcast\w*.{0,60}(MSELoss|count)|count.{0,60}broadcast|torch\.Size\(\[50, ?1\]\)")
def count_head_broadcast(fixed=False):
    seed(1)
    img, y = dots(1600, s=2)
    x, y = to_chw(img), torch.from_numpy(y)
    if fixed:
        y = y.unsqueeze(1)
    model = SmallCNN(1)
    tr, va = tensor_loaders(x[:1200], y[:1200], x[1200:], y[1200:], batch_size=50)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.MSELoss(), max_steps=300)


fix("count_head_broadcast", fixed_of(count_head_broadcast), rmse_of(), "val RMSE (count)", higher=False)


class FiveCrop(Dataset):
    """Four corner 12x12 crops and the centre crop of each image, stacked (K, C, 12, 12), as FiveCrop does."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        im = self.x[i]
        crops = [im[:, :12, :12], im[:, :12, 4:], im[:, 4:, :12], im[:, 4:, 4:], im[:, 2:14, 2:14]]
        return torch.stack(crops), self.y[i]


def multicrop_loss(fixed):
    def loss_fn(model, batch):
        crops, y = batch
        b, k = crops.shape[:2]
        logits = model(crops.flatten(0, 1))
        target = y.repeat_interleave(k) if fixed else y.repeat(k)
        return F.cross_entropy(logits, target)
    return loss_fn


@case("multicrop_labels_repeat", "shapes",
      "Five crops per image are flattened to (B*5, C, H, W) crop-major per image, but the labels are expanded with "
      "y.repeat(5) (tiled) instead of y.repeat_interleave(5): the crops get the labels of other images.",
      r"repeat_interleave|\.repeat\(|tile|crops?.{0,60}(label|target)s?.{0,40}(misalign|order|mismatch|wrong|other)|"
      r"(label|target)s?.{0,60}(misalign|out of order|do not line up|don't line up|wrong order|mismatch).{0,40}crop|"
      r"flatten.{0,40}(crop|ncrops)")
def multicrop_labels_repeat(fixed=False):
    seed(2)
    img, y = colour_blobs(1600, s=3)
    x, y = to_chw(img), torch.from_numpy(y)
    model = SmallCNN(4)
    tr = loader(FiveCrop(x[:1200], y[:1200]), 32)
    va = loader(torch.utils.data.TensorDataset(x[1200:, :, 2:14, 2:14], y[1200:]), 128, shuffle=False)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=multicrop_loss(fixed), max_steps=300)


fix("multicrop_labels_repeat", fixed_of(multicrop_labels_repeat), val_acc, "val accuracy (centre crop)")


def blob_centres(n, s):
    rng = np.random.default_rng(s)
    img = rng.normal(60, 20, (n, 16, 16, 3))
    ctr = np.zeros((n, 2), np.float32)
    for i in range(n):
        r, c = rng.integers(0, 12, 2)
        img[i, r:r + 4, c:c + 4] = 230
        ctr[i] = (r + 2 - 8) / 4, (c + 2 - 8) / 4
    return np.clip(img, 0, 255).astype(np.uint8), ctr


class CentreNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                 nn.Linear(32 * 16, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, x):
        return self.net(x)


@case("keypoint_target_extra_dim", "shapes",
      "The blob-centre targets are stored (N, 1, 2) (one keypoint per image, list of keypoints) against predictions "
      "(N, 2): MSELoss broadcasts them to (N, N, 2) and every prediction regresses to the batch-mean centre.",
      r"\(N, ?N, ?2\)|\(N, ?1, ?2\)|\(32, ?32, ?2\)|\(32, ?1, ?2\)|extra (dim|axis)|singleton (dim|axis)|"
      r"(target|keypoint|centre|center)s?.{0,60}(N, ?1, ?2|extra|middle|singleton)|squeeze\(1\) the (target|keypoint)")
def keypoint_target_extra_dim(fixed=False):
    seed(3)
    img, ctr = blob_centres(1600, 4)
    x, y = to_chw(img), torch.from_numpy(ctr)
    y = y if fixed else y.unsqueeze(1)
    model = CentreNet()
    tr, va = tensor_loaders(x[:1200], y[:1200], x[1200:], y[1200:])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.MSELoss(), max_steps=300)


fix("keypoint_target_extra_dim", fixed_of(keypoint_target_extra_dim), rmse_of(), "val RMSE (centre)", higher=False)


def smoothed_ce(fixed, eps=0.1):
    def loss_fn(model, batch):
        x, y = batch
        logits = model(x)
        target = torch.full_like(logits, eps / logits.size(1))
        if fixed:
            target.scatter_(1, y.unsqueeze(1), 1 - eps + eps / logits.size(1))
        else:
            target.scatter_(0, y.unsqueeze(1), 1 - eps + eps / logits.size(1))
        return -(target * F.log_softmax(logits, dim=1)).sum(1).mean()
    return loss_fn


@case("smoothing_scatter_dim0", "shapes",
      "Hand-written label smoothing builds the target with target.scatter_(0, y.unsqueeze(1), ...) instead of "
      "scatter_(1, ...): the confidence goes to row y[i] of column 0, not to column y[i] of row i, so the soft "
      "targets no longer encode the labels.",
      r"scatter_?\(|scatter.{0,30}(dim|axis)|dim ?= ?0|(wrong|batch) (dim|axis)|one[- ]hot|"
      r"smooth(ed|ing)? (target|label)s?.{0,60}(wrong|do not|don't|not).{0,30}(label|class)|label_smoothing")
def smoothing_scatter_dim0(fixed=False):
    seed(4)
    img, y = colour_blobs(1600, s=5)
    x, y = to_chw(img), torch.from_numpy(y)
    model = SmallCNN(4)
    tr, va = tensor_loaders(x[:1200], y[:1200], x[1200:], y[1200:])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=smoothed_ce(fixed), max_steps=300)


fix("smoothing_scatter_dim0", fixed_of(smoothing_scatter_dim0), val_acc, "val accuracy")
_ = acc_of
