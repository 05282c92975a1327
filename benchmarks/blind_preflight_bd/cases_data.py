"""Data: joint augmentation of images and their dense / box / keypoint targets, mask resizing, and survival tables
assembled in the Dataset."""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_bd import synth
from benchmarks.blind_preflight_bd.cases_trained import LandmarkNet
from benchmarks.blind_preflight_bd.common import BoxRegressor, TinyUNet, cox_fwd, cox_ph_loss, risk_mlp
from benchmarks.blind_preflight_bd.registry import case, cindex_of, fix, fixed_of, iou_of, loader, miou_of, pck_of, seed


# --- 1. random pad-and-crop drawn separately for the image and the mask -------------------------------------------
class RandomPadCrop:
    """Pad by ``pad`` pixels and crop back to the original size at a random offset (RandomCrop(32, padding=4))."""

    def __init__(self, pad=4, fill=0):
        self.pad, self.fill = pad, fill

    def __call__(self, x, offset=None):
        h, w = x.shape[-2:]
        xp = F.pad(x[None].float() if x.dim() == 2 else x, (self.pad,) * 4, value=self.fill)
        xp = xp[0].to(x.dtype) if x.dim() == 2 else xp
        dy, dx = offset if offset is not None else (random.randint(0, 2 * self.pad), random.randint(0, 2 * self.pad))
        return xp[..., dy:dy + h, dx:dx + w]


class AugmentedShapes(Dataset):
    def __init__(self, n, s, fixed, train=True):
        imgs, masks = synth.seg_shapes(n, s=s, ignore_border=True)
        self.imgs, self.masks = torch.from_numpy(imgs), torch.from_numpy(masks)
        self.img_tf, self.mask_tf = RandomPadCrop(4, 0.0), RandomPadCrop(4, 255)
        self.fixed, self.train = fixed, train

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        img, mask = self.imgs[i], self.masks[i]
        if not self.train:
            return img, mask
        if self.fixed:      # one draw for both
            off = (random.randint(0, 8), random.randint(0, 8))
            return self.img_tf(img, off), self.mask_tf(mask, off)
        return self.img_tf(img), self.mask_tf(mask)


@case("seg_crop_drawn_separately_for_image_and_mask", "data",
      "The image and its mask go through two separate RandomCrop(32, padding=4) transforms, each drawing its own "
      "offset: almost every training mask ends up shifted by up to 4 pixels against its image, so the UNet is taught "
      "object boundaries that do not line up with what it sees and learns blurred, dilated shapes.",
      r"(separate|independent|different) (random )?(draws?|transforms?|crops?|offsets?|random (numbers?|state|"
      r"params))|(same|one|single|shared) (random )?(draw|transform|crop|offset|seed|decision|params).{0,40}"
      r"(image|mask|both)|joint(ly)? (augment|transform)|(mask|label)s?.{0,40}(shifted|misalign|do not (match|line "
      r"up)|don't (match|line up))|v2\.|tv_tensors|albumentations|RandomCrop|RandomPadCrop|get_params")
def seg_crop_drawn_separately_for_image_and_mask(fixed=False):
    seed(0)
    model = TinyUNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(AugmentedShapes(640, 210, fixed), 16),
                val_loader=loader(AugmentedShapes(256, 211, fixed, train=False), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(ignore_index=255), max_steps=300)


def _seg_fwd(m, b):
    return m(b[0]), b[1]


fix("seg_crop_drawn_separately_for_image_and_mask", fixed_of(seg_crop_drawn_separately_for_image_and_mask),
    miou_of(_seg_fwd), "val mIoU")


# --- 2. horizontal flip of the image, box coordinates untouched ----------------------------------------------------
class FlipBoxes(Dataset):
    def __init__(self, n, s, fixed, train=True, size=32):
        self.imgs, self.boxes = synth.box_images(n, size=size, s=s)
        self.size, self.fixed, self.train = size, fixed, train

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        img, box = self.imgs[i], self.boxes[i].copy()
        if self.train and np.random.rand() < 0.5:
            img = img[:, :, ::-1].copy()
            if self.fixed:
                box[[0, 2]] = self.size - box[[2, 0]]
        return torch.from_numpy(img), torch.from_numpy(box / self.size)


@case("box_hflip_image_only", "data",
      "The Dataset flips the image horizontally (img[:, :, ::-1]) half the time but leaves its box as it was: for "
      "flipped samples the target box sits on the mirrored side of the object, so the regressor is trained on "
      "contradicting labels and drifts toward the image's vertical midline.",
      r"flip.{0,80}(box|bbox|coordinates|target|label)|(box|bbox|coordinates|target)s?.{0,80}(not|never|without) "
      r"(also )?(flipped|mirrored|updated|transformed)|W\s*-\s*x|width\s*-\s*x|size\s*-\s*box|x0.{0,20}x1.{0,30}"
      r"(swap|mirror)|mirror.{0,40}(box|coordinates)")
def box_hflip_image_only(fixed=False):
    seed(0)
    model = BoxRegressor()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(FlipBoxes(800, 220, fixed), 16),
                val_loader=loader(FlipBoxes(256, 221, fixed, train=False), 64, shuffle=False),
                loss_fn=nn.SmoothL1Loss(beta=0.05), max_steps=300)


def _box_fwd(m, b):
    return m(b[0]) * 32, b[1] * 32


fix("box_hflip_image_only", fixed_of(box_hflip_image_only), iou_of(_box_fwd), "val box IoU")


# --- 3. horizontal flip of landmarks without swapping left and right -----------------------------------------------
def flip_collate(fixed, size=32):
    """Batch-level augmentation in the collate_fn: flip half the batch, mirror the x of the landmarks."""
    def collate(items):
        imgs = torch.stack([torch.as_tensor(a) for a, _ in items])
        kps = torch.stack([torch.as_tensor(b) for _, b in items]).clone()   # (N, 2, 2): [left, right] x (x, y)
        flip = torch.rand(len(items)) < 0.5
        imgs[flip] = imgs[flip].flip(-1)
        kps[flip, :, 0] = 1.0 - kps[flip, :, 0]
        if fixed:
            kps[flip] = kps[flip][:, [1, 0]]          # the left landmark is now the right one
        return imgs, kps
    return collate


@case("kp_hflip_without_left_right_swap", "data",
      "The collate_fn flips half of each batch and mirrors the landmarks' x (1 - x) but does not swap the left and "
      "right landmark indices: after the flip the 'left' target sits on the right blob, so index 0 means left in half "
      "the samples and right in the other half and both heads regress toward the middle.",
      r"swap.{0,60}(left|right|keypoint|landmark|index|indices)|(left|right).{0,60}(swap|exchange|permut)|flip_?idx|"
      r"flip_index|flip_pairs|left[/ -]right|(keypoint|landmark) (order|indices|identity)|mirror(ed)? "
      r"(keypoints|landmarks).{0,40}(order|indices|identity)")
def kp_hflip_without_left_right_swap(fixed=False):
    seed(0)
    imgs, kps = synth.two_points(800, s=230)
    vi, vk = synth.two_points(256, s=231)
    model = LandmarkNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(synth.t(imgs), synth.t(kps / 32)), 16,
                                    collate_fn=flip_collate(fixed)),
                val_loader=loader(TensorDataset(synth.t(vi), synth.t(vk / 32)), 64, shuffle=False),
                loss_fn=nn.SmoothL1Loss(beta=0.05), max_steps=300)


def _kp_fwd(m, b):
    return m(b[0]) * 32, b[1] * 32


fix("kp_hflip_without_left_right_swap", fixed_of(kp_hflip_without_left_right_swap), pck_of(_kp_fwd), "val PCK@3px")


# --- 4. label masks downscaled with bilinear interpolation ---------------------------------------------------------
class Downscaled(Dataset):
    """Shapes rendered at 64x64, downscaled to the model's 32x32 input with F.interpolate."""

    def __init__(self, n, s, fixed, train=True):
        imgs, masks = synth.seg_shapes(n, size=64, s=s)
        self.imgs = F.interpolate(torch.from_numpy(imgs), size=(32, 32), mode="bilinear", align_corners=False)
        m = torch.from_numpy(masks)[:, None].float()
        if fixed or not train:
            self.masks = F.interpolate(m, size=(32, 32), mode="nearest")[:, 0].long()
        else:
            self.masks = F.interpolate(m, size=(32, 32), mode="bilinear", align_corners=False)[:, 0].round().long()

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        return self.imgs[i], self.masks[i]


@case("seg_mask_downscaled_bilinear", "data",
      "The Dataset resizes the label masks with F.interpolate(mode='bilinear') and rounds: where a square (1) meets "
      "the background (0) or a disc (2) meets the background, the averaged values 0.5-1.5 round to 1, so every disc is "
      "ringed with 'square' pixels and the edges of the other classes are relabelled.",
      r"bilinear|nearest|interpolat.{0,60}(mask|label)|(mask|label)s?.{0,60}(interpolat|resiz|resampl)|"
      r"(invalid|intermediate|spurious|new|averaged) (class|label)|INTER_NEAREST|NEAREST|averag.{0,40}(class|label) "
      r"(ids?|values?)")
def seg_mask_downscaled_bilinear(fixed=False):
    seed(0)
    model = TinyUNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(Downscaled(640, 240, fixed), 16),
                val_loader=loader(Downscaled(256, 241, fixed, train=False), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("seg_mask_downscaled_bilinear", fixed_of(seg_mask_downscaled_bilinear), miou_of(_seg_fwd), "val mIoU")


# --- 5. the time and event columns sorted for the Cox loss, the features left in file order ------------------------
class CohortTable(Dataset):
    def __init__(self, n, s, fixed):
        x, t, e, _ = synth.survival_table(n, s=s, censor_rate=0.5)
        order = np.argsort(-t)
        t, e = t[order], e[order]                    # sort by descending follow-up
        if fixed:
            x = x[order]
        self.x, self.t, self.e = x, t, e

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i]), torch.tensor(self.t[i]), torch.tensor(self.e[i])


def _cox_fn(model, batch):
    x, time, event = batch
    return cox_ph_loss(model(x).squeeze(-1), time, event)


@case("cox_table_sorted_time_not_features", "data",
      "To give the Cox loss rows in descending time, the Dataset sorts the time and event arrays with "
      "np.argsort(-t) but not the feature matrix: each subject's features now sit next to another subject's follow-up "
      "and event, so the covariates carry no information about survival.",
      r"sort.{0,80}(features?|covariates?|x\b|rows?)|(features?|covariates?|x\b).{0,60}(not|never) "
      r"(re)?(sorted|ordered|permuted|reordered)|(misaligned|out of (sync|order)|mismatched).{0,40}(features?|"
      r"time|event|labels?)|argsort|same (order|permutation|index)")
def cox_table_sorted_time_not_features(fixed=False):
    seed(0)
    xv, _, _, tv = synth.survival_table(600, s=251)
    model = risk_mlp()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4),
                train_loader=loader(CohortTable(1200, 250, fixed), 64),
                val_loader=loader(TensorDataset(synth.t(xv), synth.t(tv), torch.ones(600)), 200, shuffle=False),
                loss_fn=_cox_fn, max_steps=300)


fix("cox_table_sorted_time_not_features", fixed_of(cox_table_sorted_time_not_features), cindex_of(cox_fwd),
    "val C-index")
