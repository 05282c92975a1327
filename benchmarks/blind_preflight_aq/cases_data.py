"""Data: augmentations that move the image but not its labels, feature pipelines that differ, misaligned pairs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_aq.registry import (
    BoxNet,
    CtcNet,
    KpNet,
    SegNet,
    box_data,
    box_metric,
    case,
    ctc_data,
    ctc_metric,
    fix,
    fixed_of,
    gen,
    heatmap,
    kp_data,
    kp_metric,
    loader,
    seed,
    seg_data,
    seg_metric,
)


class FlipBoxes(Dataset):
    """Random horizontal flip for a box regressor."""

    def __init__(self, x, boxes, fixed, p=0.5, s=0):
        self.x, self.boxes, self.fixed, self.p = x, boxes, fixed, p
        self.flip = torch.rand(10 ** 5, generator=gen(s)) < p
        self.calls = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        img, box = self.x[i], self.boxes[i]
        self.calls += 1
        if self.flip[self.calls % len(self.flip)]:
            img = img.flip(-1)
            if self.fixed:
                box = torch.stack([1 - box[2], box[1], 1 - box[0], box[3]])
        return img, box


@case("box_hflip_image_only", "data",
      bug="The random horizontal flip flips the image but leaves its box as it was, so half the training boxes "
          "point at the mirror position of the object (x1' = W - x2, x2' = W - x1 is missing).",
      cause_pattern=r"(?i)((flip|mirror)\w*.{0,80}(box|bbox|coordinates?|annotation|target)s?.{0,40}(not|never|"
                    r"unchanged|as (it|they) w)|(box|bbox|coordinates?|annotation|target)s?.{0,60}(not|never) "
                    r"(flipped|mirrored|moved|updated)|W ?- ?x2|1 ?- ?x2)")
def box_hflip_image_only(fixed=False):
    seed(0)
    x, b = box_data(1200, 8)
    vx, vb = box_data(300, 9)
    model = BoxNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(FlipBoxes(x, b, fixed), 32), loss_fn=nn.SmoothL1Loss(beta=0.05),
                val_loader=loader(TensorDataset(vx, vb), 64, shuffle=False), max_steps=300)


fix("box_hflip_image_only", fixed_of(box_hflip_image_only), box_metric(), "val mean IoU")


class ShiftKeypoints(Dataset):
    """Random translation (torch.roll by 0-4 px, right and down) for a keypoint heatmap model."""

    def __init__(self, x, kp, fixed, s=0):
        self.x, self.kp, self.fixed = x, kp, fixed
        self.shifts = torch.randint(0, 5, (10 ** 5, 2), generator=gen(s))
        self.hm = heatmap(kp[:, 0], kp[:, 1])
        self.calls = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.calls += 1
        dx, dy = (int(v) for v in self.shifts[self.calls % len(self.shifts)])
        img = torch.roll(self.x[i], (dy, dx), (1, 2))
        hm, kp = self.hm[i], self.kp[i]
        if self.fixed:
            hm = torch.roll(hm, (dy, dx), (1, 2))
            kp = (kp + torch.tensor([dx, dy])) % 16
        return img, kp, hm


@case("kp_shift_heatmap_unmoved", "data",
      bug="The random translation augmentation rolls the image by 0-4 pixels right and down but not the target heatmap, so "
          "the Gaussian peaks no longer sit on the keypoints they label.",
      cause_pattern=r"(?i)((shift|translat|roll|crop|augment)\w*.{0,80}(heatmap|keypoint|target|label)s?.{0,40}"
                    r"(not|never|unchanged|misalign)|(heatmap|keypoint|target)s?.{0,60}(not|never) (shifted|moved|"
                    r"rolled|translated|updated)|misalign\w*.{0,40}(heatmap|keypoint)|(shift|translat|roll)\w*.{0,60}"
                    r"image.{0,60}not (the )?(target )?(heatmap|keypoint)|peaks? no longer (sit|lie|line up))")
def kp_shift_heatmap_unmoved(fixed=False):
    seed(0)
    x, kp = kp_data(1000, 4)
    vx, vkp = kp_data(250, 5)
    model = KpNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ShiftKeypoints(x, kp, fixed), 32),
                loss_fn=lambda m, b: F.mse_loss(m(b[0]), b[2]) * 100,
                val_loader=loader(TensorDataset(vx, vkp, heatmap(vkp[:, 0], vkp[:, 1])), 64, shuffle=False),
                max_steps=300)


fix("kp_shift_heatmap_unmoved", fixed_of(kp_shift_heatmap_unmoved), kp_metric(lambda m, b: (m(b[0]), b[1])),
    "val PCK")


def raw_fbank(n, s):
    feats, targets, ilen, tlen = ctc_data(n, s)
    return feats * 4.0 + 6.0, targets, ilen, tlen      # "log-mel" scale


def ctc_loss(m, b):
    return F.ctc_loss(m(b[0]).log_softmax(-1).transpose(0, 1).float(), b[1], b[2], b[3], zero_infinity=True)


@case("ctc_val_features_unnormalised", "data",
      bug="The log-mel features are standardised with the training mean and std for the train loader only; the "
          "validation loader feeds raw features (offset about 6, scale about 4), so the model is scored on inputs "
          "it never saw.",
      cause_pattern=r"(?i)((val|validation|eval|test)\w*.{0,80}(not|never|un)\s?(normali[sz]|standardi[sz]|scaled)|"
                    r"(normali[sz]|standardi[sz]|cmvn|mean.{0,10}std)\w*.{0,80}(train(ing)? (loader|set|split) only|"
                    r"only (to|on|for) (the )?train)|(train|val\w*).{0,40}(feature )?(statistics|distribution)s? "
                    r"(differ|mismatch))")
def ctc_val_features_unnormalised(fixed=False):
    seed(0)
    tr, va = raw_fbank(960, 6), raw_fbank(240, 7)
    mean, std = tr[0][:, :8].mean(), tr[0][:, :8].std()
    tr = ((tr[0] - mean) / std, *tr[1:])
    if fixed:
        va = ((va[0] - mean) / std, *va[1:])
    model = CtcNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(*tr), 32), loss_fn=ctc_loss,
                val_loader=loader(TensorDataset(*va), 32, shuffle=False), max_steps=300)


fix("ctc_val_features_unnormalised", fixed_of(ctc_val_features_unnormalised), ctc_metric(), "val 1-CER")


@case("ctc_sorted_features_not_transcripts", "data",
      bug="For length bucketing the utterances (features and input lengths) are sorted by duration, but the "
          "transcripts and target lengths are left in the original order, so audio and text are paired with the "
          "wrong utterance.",
      cause_pattern=r"(?i)(sort\w*.{0,80}(transcript|target|label|text)s?.{0,40}(not|never|left|unsorted|original "
                    r"order)|(transcript|target|label|text)s?.{0,60}(not|never) (re)?(sorted|reordered|permuted)|"
                    r"(audio|features?|utterances?) and (the )?(text|transcripts?|labels?|targets?).{0,40}"
                    r"(misaligned|mismatched|out of (sync|order)|paired with the wrong))")
def ctc_sorted_features_not_transcripts(fixed=False):
    seed(0)
    feats, targets, ilen, tlen = ctc_data(960, 8)
    order = torch.argsort(ilen, stable=True)
    feats, ilen = feats[order], ilen[order]
    if fixed:
        targets, tlen = targets[order], tlen[order]
    model = CtcNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(feats, targets, ilen, tlen), 32), loss_fn=ctc_loss,
                val_loader=loader(TensorDataset(*ctc_data(240, 9)), 32, shuffle=False), max_steps=300)


fix("ctc_sorted_features_not_transcripts", fixed_of(ctc_sorted_features_not_transcripts), ctc_metric(), "val 1-CER")


class CropPairs(Dataset):
    """Random 16x16 crops of 22x22 tiles and their masks."""

    def __init__(self, x, m, fixed, s=0):
        self.x, self.m, self.fixed = x, m, fixed
        self.offsets = torch.randint(0, 7, (10 ** 5, 4), generator=gen(s))
        self.calls = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.calls += 1
        ix, iy, mx, my = (int(v) for v in self.offsets[self.calls % len(self.offsets)])
        if self.fixed:
            mx, my = ix, iy
        return self.x[i, :, iy:iy + 16, ix:ix + 16], self.m[i, my:my + 16, mx:mx + 16]


@case("seg_crop_offsets_independent", "data",
      bug="RandomCrop is called separately on the image and on its mask, each drawing its own offset, so the "
          "cropped mask is shifted against the cropped image by up to 6 pixels.",
      cause_pattern=r"(?i)((crop|augment|transform)\w*.{0,80}(separately|independent\w*|own (random )?(offset|"
                    r"param)|different (random )?(offset|param))|(mask|label)s?.{0,60}(shifted|misaligned|not "
                    r"aligned|out of (sync|alignment))|same (random )?(crop|offset|param\w*).{0,40}(image and mask|"
                    r"both)|get_params)")
def seg_crop_offsets_independent(fixed=False):
    seed(0)
    x, m = seg_data(1000, 10, size=22)
    vx, vm = seg_data(250, 11)
    model = SegNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(CropPairs(x, m, fixed), 32), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(vx, vm), 64, shuffle=False), max_steps=300)


fix("seg_crop_offsets_independent", fixed_of(seg_crop_offsets_independent), seg_metric(), "val pixel acc")
