"""Healthy: five corrected twins of broken cases and five unusual but correct dense-prediction / survival setups."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_bd import synth
from benchmarks.blind_preflight_bd.cases_data import box_hflip_image_only, kp_hflip_without_left_right_swap
from benchmarks.blind_preflight_bd.cases_mechanics import cox_cumsum_risk_set_on_shuffled_batches
from benchmarks.blind_preflight_bd.cases_shapes import seg_hwc_to_chw_transpose_swaps_hw
from benchmarks.blind_preflight_bd.cases_targets import centernet_peak_not_divided_by_stride
from benchmarks.blind_preflight_bd.common import Backbone, BoxRegressor, TinyUNet, block
from benchmarks.blind_preflight_bd.registry import healthy, loader, seed, twin

healthy("seg_hwc_to_chw_transpose_swaps_hw_fixed",
        "twin: the HWC image converted with transpose(2, 0, 1)")(twin(seg_hwc_to_chw_transpose_swaps_hw))
healthy("box_hflip_image_only_fixed",
        "twin: the flip also mirrors the box, x0' = W - x1, x1' = W - x0")(twin(box_hflip_image_only))
healthy("cox_cumsum_risk_set_on_shuffled_batches_fixed",
        "twin: the Cox loss sorts each shuffled batch by descending time before the cumsum")(
    twin(cox_cumsum_risk_set_on_shuffled_batches))
healthy("centernet_peak_not_divided_by_stride_fixed",
        "twin: the Gaussian peaks drawn at centre / stride on the 16x16 map")(twin(centernet_peak_not_divided_by_stride))
healthy("kp_hflip_without_left_right_swap_fixed",
        "twin: the collate_fn swaps left and right landmarks of flipped samples")(twin(kp_hflip_without_left_right_swap))


# --- unusual but correct -------------------------------------------------------------------------------------------
def ce_plus_dice(logits, mask, ignore=255, eps=1.0):
    """Cross-entropy with void pixels ignored plus a soft Dice over the classes on the labelled pixels only."""
    ce = F.cross_entropy(logits, mask, ignore_index=ignore)
    keep = (mask != ignore).unsqueeze(1).float()
    probs = torch.softmax(logits.float(), dim=1) * keep
    onehot = F.one_hot(mask.clamp(max=logits.shape[1] - 1), logits.shape[1]).permute(0, 3, 1, 2).float() * keep
    inter = (probs * onehot).sum((0, 2, 3))
    dice = (2 * inter + eps) / (probs.sum((0, 2, 3)) + onehot.sum((0, 2, 3)) + eps)
    return ce + (1 - dice).mean()


class CeDice(nn.Module):
    def forward(self, logits, mask):
        return ce_plus_dice(logits, mask)


@healthy("seg_ce_dice_void_bf16_onecycle",
         "UNet with CE(ignore_index=255) + soft Dice restricted to labelled pixels, bf16, OneCycleLR per step")
def seg_ce_dice_void_bf16_onecycle():
    seed(0)
    imgs, masks = synth.seg_shapes(640, s=300, ignore_border=True)
    vi, vm = synth.seg_shapes(256, s=301, ignore_border=True)
    model = TinyUNet()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    return dict(model=model, optimizer=opt,
                scheduler=torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=300),
                train_loader=loader(TensorDataset(synth.t(imgs), synth.t(masks)), 16),
                val_loader=loader(TensorDataset(synth.t(vi), synth.t(vm)), 64, shuffle=False),
                loss_fn=CeDice(), precision="bf16", max_steps=300)


class CenterSizeNet(nn.Module):
    """CenterNet with a heatmap head and a (w, h) head at stride 2."""

    def __init__(self, w=16):
        super().__init__()
        self.body = nn.Sequential(block(1, w), block(w, w), nn.MaxPool2d(2), block(w, w), block(w, w))
        self.hm = nn.Conv2d(w, 1, 1)
        self.wh = nn.Conv2d(w, 2, 1)
        nn.init.constant_(self.hm.bias, -2.19)

    def forward(self, x):
        f = self.body(x)
        return self.hm(f), self.wh(f)


class CenterBoxes(Dataset):
    def __init__(self, n, s):
        self.imgs, boxes = synth.box_images(n, s=s)
        ctr = (boxes[:, :2] + boxes[:, 2:]) / 2
        self.hm = synth.gaussian_heatmap(ctr, 16, 2, sigma=1.5)
        self.cell = np.clip((ctr / 2).astype(np.int64), 0, 15)
        self.wh = ((boxes[:, 2:] - boxes[:, :2]) / 32).astype(np.float32)

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        return (torch.from_numpy(self.imgs[i]), torch.from_numpy(self.hm[i]), torch.from_numpy(self.cell[i]),
                torch.from_numpy(self.wh[i]))


def centernet_loss(model, batch, alpha=2, beta=4):
    imgs, gt, cell, wh = batch
    hm_logits, wh_pred = model(imgs)
    gt = gt.unsqueeze(1)
    pred = torch.sigmoid(hm_logits.float()).clamp(1e-4, 1 - 1e-4)
    pos = gt.eq(1).float()
    pos_loss = torch.log(pred) * (1 - pred) ** alpha * pos
    neg_loss = torch.log(1 - pred) * pred ** alpha * (1 - gt) ** beta * (1 - pos)
    focal = -(pos_loss.sum() + neg_loss.sum()) / pos.sum().clamp(min=1)
    idx = torch.arange(imgs.shape[0])
    wh_at_peak = wh_pred[idx, :, cell[:, 1], cell[:, 0]]           # (N, 2) read at each object's centre cell
    return focal + 0.5 * F.l1_loss(wh_at_peak.float(), wh)


@healthy("centernet_heatmap_size_accum_clip",
         "CenterNet focal heatmap + size regressed at the centre cell, 2-step accumulation, grad clipping 5.0")
def centernet_heatmap_size_accum_clip():
    seed(0)
    model = CenterSizeNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(CenterBoxes(800, 310), 8),
                val_loader=loader(CenterBoxes(256, 311), 64, shuffle=False),
                loss_fn=centernet_loss, accumulation_steps=2, clip_grad_norm=5.0, max_steps=300)


class PiecewiseHazard(nn.Module):
    def __init__(self, d=8, k=10):
        super().__init__()
        self.g = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
        self.baseline = nn.Parameter(torch.zeros(k))

    def forward(self, x):
        return self.g(x) + self.baseline


def masked_hazard_nll(model, batch):
    x, k, e = batch
    logits = model(x)
    steps = torch.arange(logits.shape[1])
    at_risk = (steps[None, :] <= k[:, None]).float()
    target = ((steps[None, :] == k[:, None]) & (e[:, None] > 0)).float()
    bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    return (bce * at_risk).sum() / x.shape[0]


@healthy("discrete_hazard_masked_bce_cosine",
         "discrete-time hazard (nn.Parameter baseline + MLP), BCE masked to the at-risk intervals, AdamW + cosine")
def discrete_hazard_masked_bce_cosine():
    seed(0)
    x, t, e, _ = synth.survival_table(1500, s=320)
    xv, tv, ev, _ = synth.survival_table(600, s=321)
    edges = np.quantile(t, np.linspace(0, 1, 11)[1:-1])
    k, kv = synth.discretize(t, edges).astype(np.int64), synth.discretize(tv, edges).astype(np.int64)
    model = PiecewiseHazard()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-3)
    return dict(model=model, optimizer=opt,
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=300),
                train_loader=loader(TensorDataset(synth.t(x), synth.t(k), synth.t(e)), 64),
                val_loader=loader(TensorDataset(synth.t(xv), synth.t(kv), synth.t(ev)), 200, shuffle=False),
                loss_fn=masked_hazard_nll, max_steps=300)


def cxcywh_giou(pred, target):
    """GIoU loss on (cx, cy, w, h) boxes, converted to corners inside."""
    def corners(b):
        return torch.cat([b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2], 1)
    p, t = corners(pred.float()), corners(target.float())
    lt, rb = torch.maximum(p[:, :2], t[:, :2]), torch.minimum(p[:, 2:], t[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(1)
    union = pred[:, 2:].prod(1) + target[:, 2:].prod(1) - inter + 1e-7
    hull = (torch.maximum(p[:, 2:], t[:, 2:]) - torch.minimum(p[:, :2], t[:, :2])).prod(1) + 1e-7
    return (1 - (inter / union - (hull - union) / hull)).mean() + F.l1_loss(pred, target)


class GIoU(nn.Module):
    def forward(self, pred, target):
        return cxcywh_giou(pred, target)


@healthy("box_cxcywh_giou_nesterov",
         "single-box regressor on normalised cxcywh targets, GIoU + L1 computed on corners, Nesterov SGD")
def box_cxcywh_giou_nesterov():
    seed(0)
    imgs, b = synth.box_images(800, s=330)
    vi, vb = synth.box_images(256, s=331)

    def cxcywh(x):
        return (np.concatenate([(x[:, :2] + x[:, 2:]) / 2, x[:, 2:] - x[:, :2]], 1) / 32).astype(np.float32)
    model = BoxRegressor()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True),
                train_loader=loader(TensorDataset(synth.t(imgs), synth.t(cxcywh(b))), 16),
                val_loader=loader(TensorDataset(synth.t(vi), synth.t(cxcywh(vb))), 64, shuffle=False),
                loss_fn=GIoU(), clip_grad_norm=1.0, max_steps=300)


class SoftArgmaxNet(nn.Module):
    """Two landmark heatmaps at stride 2 read out by a spatial soft-argmax: (N, 2, 2) in [0, 1]."""

    def __init__(self, w=16):
        super().__init__()
        self.backbone = Backbone(1, w)
        self.body = nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False), block(w, w))
        self.hm = nn.Conv2d(w, 2, 1)
        # the landmarks' identity is left vs right: give the head the column position (CoordConv)
        self.coord = nn.Conv2d(w + 1, w, 3, padding=1)

    def forward(self, x):
        f = self.body(self.backbone(x))                              # (N, w, 16, 16)
        n, _, h, w = f.shape
        xs = torch.linspace(0, 1, w, device=x.device).expand(n, 1, h, w)
        f = F.relu(self.coord(torch.cat([f, xs], 1)))
        prob = torch.softmax(self.hm(f).flatten(2).float(), dim=-1).view(n, 2, h, w)
        gx = (torch.arange(w, device=x.device).float() + 0.5) / w
        gy = (torch.arange(h, device=x.device).float() + 0.5) / h
        return torch.stack([(prob.sum(2) * gx).sum(-1), (prob.sum(3) * gy).sum(-1)], -1)


class FlippedLandmarks(Dataset):
    def __init__(self, n, s):
        imgs, kps = synth.two_points(n, s=s)
        self.imgs, self.kps = torch.from_numpy(imgs), torch.from_numpy(kps / 32)

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        img, kp = self.imgs[i], self.kps[i].clone()
        if torch.rand(()) < 0.5:
            img = img.flip(-1)
            kp[:, 0] = 1 - kp[:, 0]
            kp = kp[[1, 0]]                 # left <-> right after a horizontal flip
        return img, kp


@healthy("kp_soft_argmax_flip_swap",
         "landmark heatmaps read by a spatial soft-argmax, CoordConv, flips that swap left/right in the Dataset")
def kp_soft_argmax_flip_swap():
    seed(0)
    model = SoftArgmaxNet()
    vi, vk = synth.two_points(256, s=341)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(FlippedLandmarks(800, 340), 16),
                val_loader=loader(TensorDataset(synth.t(vi), synth.t(vk / 32)), 64, shuffle=False),
                loss_fn=nn.L1Loss(), max_steps=300)
