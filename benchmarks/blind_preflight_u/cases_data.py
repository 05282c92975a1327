"""Data: the image pipeline (augmentations, channel order, scaling and normalisation, 16-bit sensors, keypoint
flips)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from benchmarks.blind_preflight_u.registry import acc_of, case, fix, fixed_of, loader, mean_over, on_truth, rng, seed

cls_acc = acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))


# --- 1. random horizontal flip drawn separately for the image and the mask ----------------------------------------------

def random_hflip(arr, r, p=0.5):
    return arr[..., ::-1].copy() if r.random() < p else arr


class HarbourScenes(Dataset):
    """Boats moored along the left quay: class 1 pixels, mostly in the left half of each 16x16 frame."""

    def __init__(self, n, s, fixed, augment):
        r = rng(s)
        self.fixed, self.augment, self.r = fixed, augment, rng(s + 1000)
        self.images = r.normal(0.3, 0.06, (n, 3, 16, 16)).astype(np.float32)
        self.images[:, 2] += 0.25                                      # water
        self.masks = np.zeros((n, 16, 16), dtype=np.int64)
        for i in range(n):
            for _ in range(r.integers(1, 3)):
                y, x, h, w = r.integers(0, 13), r.integers(0, 5), r.integers(2, 4), r.integers(3, 6)
                self.masks[i, y:y + h, x:x + w] = 1
                self.images[i, :, y:y + h, x:x + w] = np.array([0.85, 0.8, 0.75])[:, None, None]

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image, mask = self.images[i], self.masks[i]
        if self.augment:
            if self.fixed:
                if self.r.random() < 0.5:
                    image, mask = image[..., ::-1].copy(), mask[..., ::-1].copy()
            else:
                image = random_hflip(image, self.r)
                mask = random_hflip(mask, self.r)
        return torch.from_numpy(np.ascontiguousarray(image)), torch.from_numpy(np.ascontiguousarray(mask))


def boat_iou(model, kw):
    def fn(m, b):
        p, t = m(b[0]).argmax(1) == 1, b[1] == 1
        return (p & t).sum().item(), (p | t).sum().item()
    return mean_over(model, kw["val_loader"], fn)


@case("harbour_flip_image_and_mask_separately", "data",
      bug="The segmentation dataset calls its random horizontal flip once on the image and once on the mask, each with "
          "its own coin toss: half of the flipped samples show the boats on one side and the mask on the other, so "
          "the model is taught boats on both sides of the harbour.",
      cause_pattern=r"(flip|augment|transform)\w*.{0,120}(independent(ly)?|separate(ly)?|own (coin|random)|"
                    r"different random)|(same|identical|shared) (random )?(flip|transform|augmentation|param\w*)"
                    r".{0,60}(image and (the )?mask|mask and (the )?image|both)"
                    r"|(mask|target)s?.{0,60}(not|never|differently) (flipped|augmented|transformed)"
                    r"|(image|input)s? and (masks?|targets?).{0,40}(misaligned|out of sync|not aligned)")
def harbour_flip(fixed=False):
    seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 2, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(HarbourScenes(800, 41, fixed, augment=True), 16),
                val_loader=loader(HarbourScenes(200, 42, fixed, augment=False), 50, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("harbour_flip_image_and_mask_separately", fixed_of(harbour_flip), boat_iou, "val boat IoU")


# --- 2. training frames read with cv2 (BGR), validation frames with PIL (RGB) ---------------------------------------------

def _ripeness(n, s):
    """Tomato ripeness from colour: green (0), orange (1), red (2) fruit on a grey belt, HWC uint8 RGB."""
    r = rng(s)
    y = r.integers(0, 3, n)
    colour = np.array([[60, 170, 60], [230, 140, 40], [200, 30, 40]], dtype=np.float32)
    img = np.clip(r.normal(120, 25, (n, 12, 12, 3)), 0, 255)
    for i in range(n):
        cy, cx = r.integers(3, 9, 2)
        img[i, cy - 3:cy + 3, cx - 3:cx + 3] = colour[y[i]] + r.normal(0, 20, 3)
    return img.astype(np.uint8), y


def imread_cv2(rgb):
    """What cv2.imread returns for the stored JPEG: the same pixels in BGR order."""
    return rgb[..., ::-1]


def imread_pil(rgb):
    return rgb


class BeltFrames(Dataset):
    def __init__(self, n, s, reader):
        self.rgb, self.labels = _ripeness(n, s)
        self.reader = reader

    def __len__(self):
        return len(self.rgb)

    def __getitem__(self, i):
        img = self.reader(self.rgb[i]).astype(np.float32) / 255.0
        return torch.from_numpy(img.transpose(2, 0, 1).copy()), int(self.labels[i])


def _colour_cnn(cin=3, n_out=3):
    return nn.Sequential(nn.Conv2d(cin, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1),
                         nn.Flatten(), nn.Linear(32, n_out))


@case("tomato_train_bgr_val_rgb", "data",
      bug="The training Dataset loads frames with cv2.imread (BGR channel order, never converted with cvtColor) while "
          "the validation Dataset uses PIL (RGB): in training red and orange fruit arrive with their red in channel 2 "
          "(they look blue), so on validation the ripe tomatoes no longer look like anything the model learned.",
      cause_pattern=r"\bBGR\b|cv2|cvtColor|channel order.{0,80}(train|val)|(train\w*|val\w*).{0,80}channel order"
                    r"|RGB.{0,30}(vs\.?|versus|and).{0,10}BGR|\[\.\.\., ?::-1\]")
def tomato_bgr(fixed=False):
    seed(0)
    train_reader = (lambda rgb: imread_cv2(rgb)[..., ::-1]) if fixed else imread_cv2
    model = _colour_cnn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(BeltFrames(900, 43, train_reader), 32),
                val_loader=loader(BeltFrames(300, 44, imread_pil), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=250)


fix("tomato_train_bgr_val_rgb", fixed_of(tomato_bgr), cls_acc, "val accuracy", steps=250)


# --- 3. 0-255 ImageNet statistics applied after dividing by 255 -------------------------------------------------------------

MEAN_255 = np.array([123.675, 116.28, 103.53], dtype=np.float32)
STD_255 = np.array([58.395, 57.12, 57.375], dtype=np.float32)


def _pill_blisters(n, s):
    """Blister-pack cells: intact pill (0), cracked pill (1), empty cell (2), HWC uint8."""
    r = rng(s)
    y = r.integers(0, 3, n)
    img = np.clip(r.normal(150, 30, (n, 12, 12, 3)), 0, 255)
    for i in range(n):
        if y[i] == 2:
            continue
        cy, cx = r.integers(4, 8, 2)
        img[i, cy - 3:cy + 3, cx - 3:cx + 3] = 235 + r.normal(0, 8, 3)
        if y[i] == 1:
            img[i, cy - 3:cy + 3, cx] = 90
    return img.astype(np.uint8), y


class BlisterCells(Dataset):
    def __init__(self, n, s, fixed):
        self.images, self.labels = _pill_blisters(n, s)
        self.fixed = fixed

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        img = self.images[i].astype(np.float32) / 255.0                  # like ToTensor
        if self.fixed:
            img = (img - MEAN_255 / 255) / (STD_255 / 255)
        else:
            img = (img - MEAN_255) / STD_255                               # mmcv-style stats from the config
        return torch.from_numpy(img.transpose(2, 0, 1).copy()), int(self.labels[i])


@case("blister_imagenet_stats_0_255_on_unit_range", "data",
      bug="The pipeline divides pixels by 255 (like ToTensor) and then normalises with the 0-255 ImageNet statistics "
          "mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375] from an mmcv config: every input becomes about "
          "-2 with a spread of ~0.003 within a channel, and the pill/crack contrast is ~60x smaller than the network expects.",
      cause_pattern=r"123\.6|58\.3|(mean|std|statistic)\w*.{0,60}(0-255|0\.\.255|\[0, ?255\]|255 (scale|range)|pixel "
                    r"scale)|(0-255|\[0, ?255\]).{0,60}(mean|std|statistic)|(after|already) (to_?tensor|divid\w* by 255"
                    r"|scal\w* to \[0, ?1\])")
def blister_norm(fixed=False):
    seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, 3))
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                train_loader=loader(BlisterCells(900, 45, fixed), 32),
                val_loader=loader(BlisterCells(300, 46, fixed), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("blister_imagenet_stats_0_255_on_unit_range", fixed_of(blister_norm), cls_acc, "val accuracy")


# --- 4. 16-bit X-ray tiles fed as raw counts ----------------------------------------------------------------------------

def _xray_tiles(n, s):
    """Weld X-ray tiles as the detector writes them (uint16, ~8000-50000 counts): porosity (1), crack (2), ok (0)."""
    r = rng(s)
    y = r.integers(0, 3, n)
    img = r.normal(30000, 5000, (n, 12, 12))
    for i in range(n):
        cy, cx = r.integers(3, 9, 2)
        if y[i] == 1:
            img[i, cy - 1:cy + 2, cx - 1:cx + 2] -= 15000
        elif y[i] == 2:
            img[i, cy, 1:11] -= 15000
    return np.clip(img, 0, 65535).astype(np.uint16), y


class WeldTiles(Dataset):
    def __init__(self, n, s, fixed):
        self.tiles, self.labels = _xray_tiles(n, s)
        self.fixed = fixed

    def __len__(self):
        return len(self.tiles)

    def __getitem__(self, i):
        tile = self.tiles[i].astype(np.float32)          # ToTensor leaves 'I;16' images unscaled
        if self.fixed:
            tile = tile / 65535.0
        return torch.from_numpy(tile)[None], int(self.labels[i])


@case("weld_uint16_counts_unscaled", "data",
      bug="The 16-bit weld X-ray tiles (uint16, 'I;16') are converted with astype(float32) as ToTensor does for 16-bit "
          "images, i.e. without any scaling: the network gets raw counts around 30000 instead of values in [0, 1], "
          "its first activations are ~1e4 and SGD's steps throw the weights around instead of learning the defects.",
      cause_pattern=r"uint16|16-?bit|I;16|65535|(not|never|without) (being )?(scaled|normali[sz]ed|divided).{0,60}"
                    r"(16|65535|counts|\[0, ?1\])|raw (detector )?(counts|intensit)")
def weld_uint16(fixed=False):
    seed(0)
    model = _colour_cnn(1, 3)
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                train_loader=loader(WeldTiles(900, 47, fixed), 32),
                val_loader=loader(WeldTiles(300, 48, fixed), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("weld_uint16_counts_unscaled", fixed_of(weld_uint16), cls_acc, "val accuracy")


# --- 5. horizontal flip of a pose sample without swapping the left/right keypoints -----------------------------------------

class HandPoses(Dataset):
    """Frontal worker at a bench: keypoints (left wrist, right wrist) as (x, y) / 16. Facing the camera, the left
    wrist is on the image's right. Both wrists look alike (bright gloves)."""

    def __init__(self, n, s, fixed, augment):
        r = rng(s)
        self.fixed, self.augment, self.r = fixed, augment, rng(s + 1000)
        self.images = r.normal(0.3, 0.05, (n, 1, 16, 16)).astype(np.float32)
        self.kps = np.zeros((n, 2, 2), dtype=np.float32)
        for i in range(n):
            ly, ry = r.integers(2, 14, 2)
            lx, rx = r.integers(9, 14), r.integers(2, 7)
            for (x, y) in ((lx, ly), (rx, ry)):
                self.images[i, 0, y - 1:y + 2, x - 1:x + 2] = 0.9
            self.kps[i] = [[lx, ly], [rx, ry]]
        self.kps /= 16.0

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image, kps = self.images[i], self.kps[i].copy()
        if self.augment and self.r.random() < 0.5:
            image = image[..., ::-1].copy()
            kps[:, 0] = (15.0 / 16) - kps[:, 0]
            if self.fixed:
                kps = kps[[1, 0]]                    # a mirrored left wrist is the right wrist
        return torch.from_numpy(image), torch.from_numpy(kps.reshape(-1))


def wrist_error(model, kw):
    ds = kw["val_loader"].dataset
    pred = on_truth(model, torch.from_numpy(ds.images), lambda m, x: m(x)).reshape(-1, 2, 2)
    return ((pred - torch.from_numpy(ds.kps)) * 16).norm(dim=-1).mean().item()


@case("pose_flip_without_left_right_swap", "data",
      bug="The pose augmentation mirrors the image and the keypoints' x (x -> W-1-x) but does not swap the left and "
          "right wrist entries: on flipped samples the 'left wrist' target sits on the image's left, on the others on "
          "its right, so the model learns to put both wrists in the middle.",
      cause_pattern=r"(left|right).{0,60}(swap|exchang|permut)|flip_?(pairs|index|perm|idx)"
                    r"|(keypoint|joint|wrist)s?.{0,80}(left.{0,6}right|symmetr|swap)"
                    r"|(flip|mirror)\w*.{0,80}(without|not|never).{0,40}(swap|relabel)")
def pose_flip(fixed=False):
    seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 16, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(HandPoses(1000, 49, fixed, augment=True), 32),
                val_loader=loader(HandPoses(300, 50, fixed, augment=False), 100, shuffle=False),
                loss_fn=nn.SmoothL1Loss(beta=0.05), max_steps=300)


fix("pose_flip_without_left_right_swap", fixed_of(pose_flip), wrist_error, "val wrist error (px)", higher=False)
