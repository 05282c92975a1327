"""Set l, family data: what the DataLoader delivers is not what the labels say."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.blind_preflight_l.cases_mechanics import foreground_iou
from benchmarks.blind_preflight_l.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------------
# Hand-signal arrows (left / right / up / down) with a random horizontal flip as augmentation.

_DIRS = ["left", "right", "up", "down"]


def _arrows(n: int, s: int, H: int = 12):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    base = torch.zeros(4, H, H)
    shaft, head = slice(3, 9), [(5, 4), (4, 4), (6, 4), (3, 3), (7, 3)]
    base[0, 6, shaft] = 1  # an arrow pointing left: shaft plus head on the left
    for r, c in head:
        base[0, r, c - 1] = 1
    base[1] = base[0].flip(-1)
    base[2] = base[0].t()
    base[3] = base[2].flip(0)
    shift = torch.randint(-2, 3, (n, 2), generator=g)
    x = torch.stack([base[int(y[i])].roll((int(shift[i, 0]), int(shift[i, 1])), (0, 1)) for i in range(n)])
    x = x + 0.3 * torch.randn(n, H, H, generator=g)
    return x.unsqueeze(1), y


class ArrowDataset(Dataset):
    def __init__(self, x, y, augment: str):
        self.x, self.y, self.augment = x, y, augment

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        img, label = self.x[i], self.y[i]
        if self.augment == "hflip" and torch.rand(1).item() < 0.5:  # RandomHorizontalFlip(p=0.5)
            img = img.flip(-1)
        return img, label


def _arrow_cnn():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 9, 4))


@case("data_horizontal_flip_augmentation_on_direction_labels", "data",
      bug="The training Dataset applies a random horizontal flip (p=0.5) to every image, but the classes are arrow "
          "directions: a flipped 'left' arrow is a 'right' arrow still labelled 'left', so half the left/right "
          "examples carry the wrong label and the model cannot tell left from right (drop the flip or swap the "
          "label with it).",
      cause_pattern=r"flip\w*|mirror\w*|(augment\w*).{0,80}(label|direction|left|right)|(left|right).{0,60}"
                    r"(swap|mislabel|wrong label)")
def flip_labels(fixed: bool = False):
    seed(0)
    x, y = _arrows(2048, 41)
    vx, vy = _arrows(512, 42)
    model = _arrow_cnn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ArrowDataset(x, y, "none" if fixed else "hflip"), 32),
                val_loader=DataLoader(TensorDataset(vx, vy), 256), loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("data_horizontal_flip_augmentation_on_direction_labels", fixed_of(flip_labels),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")

# --------------------------------------------------------------------------------------------------------------------
# Nuclei segmentation: random flips applied to the image but not to its mask.


def _nuclei(n: int, s: int, H: int = 16):
    g = gen(s)
    yy, xx = torch.meshgrid(torch.arange(H), torch.arange(H), indexing="ij")
    cy = torch.randint(2, H - 2, (n, 1, 1), generator=g)
    cx = torch.randint(2, H - 2, (n, 1, 1), generator=g)
    mask = (((yy - cy) / 3.0) ** 2 + ((xx - cx) / 2.0) ** 2 <= 1).long()
    img = (mask.float() + 0.4 * torch.randn(n, H, H, generator=g)).unsqueeze(1)
    return img, mask


class NucleiDataset(Dataset):
    def __init__(self, img, mask, joint: bool):
        self.img, self.mask, self.joint = img, mask, joint

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        img, mask = self.img[i], self.mask[i]
        hflip, vflip = torch.rand(2).tolist()
        if hflip < 0.5:
            img = img.flip(-1)
            if self.joint:
                mask = mask.flip(-1)
        if vflip < 0.5:
            img = img.flip(-2)
            if self.joint:
                mask = mask.flip(-2)
        return img, mask


def _seg_model():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 2, 1))


@case("data_segmentation_flip_applied_to_image_only", "data",
      bug="The segmentation Dataset's random horizontal and vertical flips are applied to the image but not to "
          "its mask, so three times out of four the target mask no longer lies under the nucleus in the input and "
          "the per-pixel labels are mostly wrong (apply the same flip to image and mask).",
      cause_pattern=r"(mask|target|label)s?.{0,80}(not|never|isn't|aren't) .{0,20}(flip|transform|augment)|"
                    r"(flip|transform|augment)\w*.{0,80}(image|input) (but|and) not .{0,20}mask|same (flip|transform|"
                    r"augmentation)|misalign\w*|(image|mask) and (mask|image) .{0,40}(out of sync|differ|mismatch)")
def seg_flip(fixed: bool = False):
    seed(0)
    img, mask = _nuclei(2048, 43)
    vimg, vmask = _nuclei(512, 44)
    model = _seg_model()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(NucleiDataset(img, mask, joint=fixed), 32),
                val_loader=DataLoader(TensorDataset(vimg, vmask), 256), loss_fn=nn.CrossEntropyLoss(),
                max_steps=2000)


fix("data_segmentation_flip_applied_to_image_only", fixed_of(seg_flip), foreground_iou, "val foreground IoU")

# --------------------------------------------------------------------------------------------------------------------
# Sensor-strip images as uint8 arrays, scaled to [0, 1] by a to_tensor step and then divided by 255 again.


def _strips(n: int, s: int, H: int = 16):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    img = 60 + 25 * torch.randn(n, H, H, generator=g)
    pos = torch.randint(2, H - 2, (n,), generator=g)
    for i in range(n):
        p, c = int(pos[i]), int(y[i])
        if c == 0:
            img[i, p - 1:p + 1, :] += 120
        elif c == 1:
            img[i, :, p - 1:p + 1] += 120
        elif c == 2:
            img[i].diagonal(offset=p - H // 2).add_(120)
        else:
            img[i].flip(-1).diagonal(offset=p - H // 2).add_(120)
    return img.clamp(0, 255).to(torch.uint8).numpy(), y


def to_tensor(arr: np.ndarray) -> torch.Tensor:
    """torchvision's ToTensor for a uint8 HxW array: a float tensor scaled to [0, 1] with a channel dim."""
    return torch.from_numpy(arr).float().div(255).unsqueeze(0)


class StripDataset(Dataset):
    def __init__(self, arrays, labels, rescale: bool):
        self.arrays, self.labels, self.rescale = arrays, labels, rescale

    def __len__(self):
        return len(self.arrays)

    def __getitem__(self, i):
        x = to_tensor(self.arrays[i])
        if self.rescale:
            x = x / 255.0  # normalise the pixels, as in the Keras notebook
        return x, self.labels[i]


def _strip_cnn():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(16, 4))


@case("data_pixels_divided_by_255_twice", "data",
      bug="Each image goes through a ToTensor-style step that already scales the uint8 pixels to [0, 1] and is then "
          "divided by 255 again in the Dataset: the network sees inputs in [0, 0.004], its first-layer gradients "
          "are 255 times too small for the SGD learning rate, and the conv filters barely move.",
      cause_pattern=r"255|(scal|normali[sz])\w* twice|twice|double[- ]?(scal|normali)|(tiny|very small|near[- ]zero)"
                    r" (input|pixel|value)|\[0, ?0\.00[0-9]*\]|max(imum)? (input |pixel )?(value )?(of |is )?0\.00")
def double_scaling(fixed: bool = False):
    seed(0)
    arrays, y = _strips(2048, 45)
    varrays, vy = _strips(512, 46)
    model = _strip_cnn()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(StripDataset(arrays, y, rescale=not fixed), 32),
                val_loader=DataLoader(StripDataset(varrays, vy, rescale=not fixed), 256),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("data_pixels_divided_by_255_twice", fixed_of(double_scaling), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")

# --------------------------------------------------------------------------------------------------------------------
# Spoken-command features whose class-name -> index map is rebuilt from each split's own order of appearance.

_COMMANDS = ["yes", "no", "up", "down", "left", "right", "stop", "go"]


def _commands(n: int, s: int):
    g = gen(s)
    names = [_COMMANDS[k] for k in torch.randint(0, 8, (n,), generator=g).tolist()]
    centers = 1.5 * torch.randn(8, 20, generator=gen(47))
    x = torch.stack([centers[_COMMANDS.index(c)] for c in names]) + torch.randn(n, 20, generator=g)
    return x, names


def encode(names, mapping=None):
    mapping = mapping or {c: i for i, c in enumerate(dict.fromkeys(names))}  # classes in order of appearance
    return torch.tensor([mapping[c] for c in names]), mapping


@case("data_val_labels_encoded_with_their_own_mapping", "data",
      bug="The class-name to index mapping is built separately for each split from the order in which the names "
          "first appear (enumerate(dict.fromkeys(names))), so the validation split numbers the eight commands "
          "differently from the training split: the validation labels are a permutation of the training ones and "
          "validation accuracy stays near chance however well the model learns.",
      cause_pattern=r"(mapping|encod\w*|vocab\w*|class.{0,20}index).{0,80}(train\w*|validation|val|split)s? .{0,40}"
                    r"(differ|inconsistent|mismatch|separate|own)|(different|inconsistent|separate|own) "
                    r"(label |class )?(mapping|encoding|ordering)|permut\w+|fit\w* (separately|on each split)")
def label_mapping(fixed: bool = False):
    seed(0)
    x, names = _commands(3072, 48)
    vx, vnames = _commands(768, 49)
    y, mapping = encode(names)
    vy, _ = encode(vnames, mapping if fixed else None)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 8))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=DataLoader(TensorDataset(vx, vy), 256),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("data_val_labels_encoded_with_their_own_mapping", fixed_of(label_mapping),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy (validation labels as encoded by the run)")

# --------------------------------------------------------------------------------------------------------------------
# Hourly electricity load: the target column shifted the wrong way.


def _load_series(s: int, n: int = 6000):
    g = gen(s)
    t = torch.arange(n, dtype=torch.float32)
    ar = torch.zeros(n)
    noise = 0.3 * torch.randn(n, generator=g)
    for k in range(1, n):
        ar[k] = 0.6 * ar[k - 1] + noise[k]
    return torch.sin(2 * math.pi * t / 6) + 0.5 * torch.sin(2 * math.pi * t / 17) + ar


def _windows(series: torch.Tensor, W: int, shift: int):
    """Rows t = W-1 .. : features load[t-W+1 .. t]; target = load.shift(shift)[t] (pandas: shift(-1) is t+1)."""
    rows = range(W - 1 + max(shift, 0), len(series) - max(-shift, 0))
    x = torch.stack([series[t - W + 1:t + 1] for t in rows])
    y = torch.stack([series[t - shift] for t in rows]).unsqueeze(1)
    return x, y


@case("data_forecast_target_shifted_backwards", "data",
      bug="The forecasting target is built as load.shift(1) instead of load.shift(-1): each row's target is the "
          "previous hour's load, which is already inside the input window, so the model learns to copy one of its "
          "inputs (the training loss goes to almost zero) instead of forecasting the next hour.",
      cause_pattern=r"shift\(\s*1\s*\)|shift\(-1\)|shift\w* .{0,40}(wrong|backward|opposite|past)|"
                    r"(target|label)s?.{0,80}(previous|past|already (in|inside|part of)|contained in|leak)|"
                    r"(input|feature)s? (window )?.{0,40}(contain|include)s? the (target|label)|predict\w* the past")
def shifted_target(fixed: bool = False):
    seed(0)
    series = _load_series(50)
    x, y = _windows(series[:4800], 24, -1 if fixed else 1)
    vx, vy = _windows(series[4800:], 24, -1 if fixed else 1)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=DataLoader(TensorDataset(vx, vy), 256),
                loss_fn=nn.MSELoss(), max_steps=1500)


def _next_hour_rmse(model, kw):
    series = _load_series(50)
    vx, vy = _windows(series[4800:], 24, -1)
    return rmse_of(lambda m, b: (m(b[0]), b[1]))(model, {"val_loader": DataLoader(TensorDataset(vx, vy), 256)})


fix("data_forecast_target_shifted_backwards", fixed_of(shifted_target), _next_hour_rmse,
    "RMSE of the next hour's load (the forecast the run is for)", higher=False)
