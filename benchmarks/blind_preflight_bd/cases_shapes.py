"""Shapes: layouts and axes of dense targets (HWC images, channels-last heads, flattened heatmaps, broadcasting in
hand-written dense and survival losses)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_bd import synth
from benchmarks.blind_preflight_bd.common import (
    BoxRegressor,
    HeatmapNet,
    TinyUNet,
    block,
    cox_fwd,
    risk_mlp,
    survival_loaders,
)
from benchmarks.blind_preflight_bd.registry import case, cindex_of, fix, fixed_of, iou_of, loader, miou_of, pck_of, seed


# --- 1. HWC -> CHW with the wrong transpose: the image is spatially transposed, the mask is not -------------------
class ShapesFromDisk(Dataset):
    """Images stored as HWC float arrays (as cv2/PIL give them), masks as (H, W) label maps with a 255 frame."""

    def __init__(self, n, s, fixed):
        self.imgs, self.masks = synth.seg_shapes(n, s=s, ignore_border=True, hw_last=True)
        self.fixed = fixed

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        img = self.imgs[i]                                    # (H, W, 3)
        img = img.transpose(2, 0, 1) if self.fixed else img.transpose(2, 1, 0)   # to (3, H, W)
        return torch.from_numpy(np.ascontiguousarray(img)), torch.from_numpy(self.masks[i])


@case("seg_hwc_to_chw_transpose_swaps_hw", "shapes",
      "The Dataset converts the HWC image to CHW with img.transpose(2, 1, 0) instead of transpose(2, 0, 1): on square "
      "images the shape is still (3, H, W) but the image's H and W axes are swapped, so every image is transposed "
      "relative to its (H, W) mask and the UNet is asked to segment the mirror-diagonal of what it sees.",
      r"transpose\(2,\s*1,\s*0\)|transpose\(2,\s*0,\s*1\)|permute\(2,\s*0,\s*1\)|(height|rows?|\bH\b).{0,40}(width|"
      r"columns?|\bW\b).{0,40}(swapped|transposed|exchanged|interchanged)|(swapped|transposed|exchanged).{0,40}"
      r"(height|width|H and W|spatial ax)|image.{0,60}transposed.{0,60}(mask|label)|(mask|label)s?.{0,60}"
      r"(transposed|diagonal)|not (spatially )?aligned with (its|the) (mask|label)|image and (its )?mask.{0,40}"
      r"(misaligned|disagree|do not line up|don't line up)|mirror.{0,20}diagonal")
def seg_hwc_to_chw_transpose_swaps_hw(fixed=False):
    seed(0)
    model = TinyUNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ShapesFromDisk(640, 0, fixed), 16),
                val_loader=loader(ShapesFromDisk(256, 1, fixed), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(ignore_index=255), max_steps=300)


def _seg_fwd(m, b):
    return m(b[0]), b[1]


fix("seg_hwc_to_chw_transpose_swaps_hw", fixed_of(seg_hwc_to_chw_transpose_swaps_hw), miou_of(_seg_fwd), "val mIoU")


# --- 2. channels-last per-pixel head put back with view instead of permute ---------------------------------------
class PixelMLPSeg(nn.Module):
    """Conv trunk, then a per-pixel MLP classifier applied channels-last (nn.Linear over the feature vector)."""

    def __init__(self, n_classes=3, w=16, fixed=False):
        super().__init__()
        self.trunk = nn.Sequential(block(3, w), block(w, w))
        self.classifier = nn.Sequential(nn.Linear(w, 32), nn.ReLU(), nn.Linear(32, n_classes))
        self.n_classes, self.fixed = n_classes, fixed

    def forward(self, x):
        f = self.trunk(x)                          # (N, w, H, W)
        n, _, h, w = f.shape
        f = f.permute(0, 2, 3, 1)                  # (N, H, W, w) for nn.Linear
        logits = self.classifier(f)                # (N, H, W, C)
        if self.fixed:
            return logits.permute(0, 3, 1, 2)
        return logits.reshape(n, self.n_classes, h, w)   # back to NCHW for CrossEntropyLoss


@case("seg_channels_last_logits_reshaped_not_permuted", "shapes",
      "The per-pixel classifier's (N, H, W, C) logits are turned back into NCHW with reshape(n, C, h, w) instead of "
      "permute(0, 3, 1, 2): the shape is right but the memory is reinterpreted, so each 'pixel' of the C-channel map "
      "mixes class scores of different pixels and CrossEntropyLoss compares scrambled logits with the mask.",
      r"(reshape|view)\(n|(reshape|view)(\(\w*\))? (from|to|back to|into) (NCHW|\(N, ?C|channels)|permute\(0,\s*3,\s*1,\s*2\)|channels?[- ]last.{0,80}(channels?[- ]first|NCHW)|"
      r"\(N,\s*H,\s*W,\s*C\)|reinterpret|scrambl|(class|channel) (scores|logits).{0,60}(mixed|interleaved|shuffled|"
      r"different pixels)|instead of (a )?(permute|transpose|movedim)|use (permute|movedim)|"
      r"(reshape|view) (does not|doesn't|cannot) (move|reorder|transpose)")
def seg_channels_last_logits_reshaped_not_permuted(fixed=False):
    seed(0)
    imgs, masks = synth.seg_shapes(640, s=10)
    vi, vm = synth.seg_shapes(256, s=11)
    model = PixelMLPSeg(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4),
                train_loader=loader(TensorDataset(synth.t(imgs), synth.t(masks)), 16),
                val_loader=loader(TensorDataset(synth.t(vi), synth.t(vm)), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("seg_channels_last_logits_reshaped_not_permuted", fixed_of(seg_channels_last_logits_reshaped_not_permuted),
    miou_of(_seg_fwd), "val mIoU")


# --- 3. keypoint as a classification over heatmap cells: flat index x * W + y -----------------------------------
STRIDE = 2


def _cell_target(centres, out_w, fixed):
    cx = (centres[:, 0] / STRIDE).long().clamp(0, out_w - 1)
    cy = (centres[:, 1] / STRIDE).long().clamp(0, out_w - 1)
    return cy * out_w + cx if fixed else cx * out_w + cy


def _decode_argmax(hm):
    n, _, h, w = hm.shape
    idx = hm.reshape(n, -1).argmax(1)
    return torch.stack([(idx % w).float(), (idx // w).float()], 1) * STRIDE + STRIDE / 2


def _heatmap_ce(fixed):
    def loss_fn(model, batch):
        imgs, centres = batch
        hm = model(imgs)                                   # (N, 1, h, w)
        target = _cell_target(centres, hm.shape[-1], fixed)
        return F.cross_entropy(hm.flatten(1), target)      # softmax over all cells
    return loss_fn


@case("kp_heatmap_flat_index_x_times_w", "shapes",
      "The target cell of the softmax-over-heatmap keypoint loss is computed as x * W + y, but hm.flatten(1) is "
      "row-major (index = y * W + x): the class index points at the transposed cell, so the net learns to fire at "
      "(y, x) and the argmax decoder reads every keypoint at the swapped position.",
      r"row[- ]major|y\s*\*\s*W\s*\+\s*x|x\s*\*\s*W\s*\+\s*y|flatten\(|flat(tened)? (index|position)|(x|y) and (y|x) "
      r"(are )?(swapped|transposed|exchanged)|transposed cell|(swapped|transposed) (coordinates|cell|position)|"
      r"column[- ]major|index.{0,40}(order|layout).{0,40}(wrong|mismatch|flatten)")
def kp_heatmap_flat_index_x_times_w(fixed=False):
    seed(0)
    imgs, ctr = synth.blob_centers(800, s=20)
    vi, vc = synth.blob_centers(256, s=21)
    model = HeatmapNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(synth.t(imgs), synth.t(ctr)), 16),
                val_loader=loader(TensorDataset(synth.t(vi), synth.t(vc)), 64, shuffle=False),
                loss_fn=_heatmap_ce(fixed), max_steps=300)


def _hm_fwd(m, b):
    return _decode_argmax(m(b[0])), b[1]


fix("kp_heatmap_flat_index_x_times_w", fixed_of(kp_heatmap_flat_index_x_times_w), pck_of(_hm_fwd),
    "val PCK@3px")


# --- 4. boxes returned as a Python list: default_collate transposes them, reshape(-1, 4) "fixes" the shape ------
class BoxList(Dataset):
    """Returns (image, [x0, y0, x1, y1]) with the box as plain floats normalised to the image size, as parsed from
    an annotation file."""

    def __init__(self, n, s, size=32):
        self.imgs, self.boxes = synth.box_images(n, size=size, s=s)
        self.size = size

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        return torch.from_numpy(self.imgs[i]), [float(v) / self.size for v in self.boxes[i]]


def _box_l1(fixed):
    def loss_fn(model, batch):
        imgs, box = batch                         # default_collate: box is a list of 4 tensors of shape (N,)
        target = torch.stack(box, dim=1) if fixed else torch.stack(box).reshape(-1, 4)
        return F.smooth_l1_loss(model(imgs), target, beta=0.05)
    return loss_fn


@case("box_list_collated_then_reshaped", "shapes",
      "The Dataset returns each box as a Python list of 4 floats; default_collate turns that into a list of 4 "
      "tensors of shape (N,), and torch.stack(box).reshape(-1, 4) gives a (4, N) stack read row by row, so each row of "
      "the target mixes coordinates of different images (x0 of four images, then y0 of four...) instead of "
      "torch.stack(box, dim=1).",
      r"default_collate|collat|list of (4|four) tensors|torch\.stack\(box|stack\(.{0,20}dim\s*=\s*1|\(4,\s*N\)|"
      r"reshape\(-1,\s*4\)|coordinates of different (images|samples)|(boxes|targets?) (are )?(transposed|"
      r"scrambled|mixed)|mix(es|ed)? (coordinates|values) (of|from|across) (different )?(images|samples)|"
      r"return (the box as )?a tensor")
def box_list_collated_then_reshaped(fixed=False):
    seed(0)
    model = BoxRegressor()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(BoxList(800, 50), 16),
                val_loader=loader(BoxList(256, 51), 64, shuffle=False),
                loss_fn=_box_l1(fixed), max_steps=300)


def _box_fwd(m, b):
    return m(b[0]) * 32, torch.stack(b[1], dim=1) * 32


fix("box_list_collated_then_reshaped", fixed_of(box_list_collated_then_reshaped), iou_of(_box_fwd), "val box IoU")


# --- 5. Cox partial likelihood with (N, 1) risk scores against an (N,) event vector ------------------------------
def deepsurv_loss(fixed):
    def loss_fn(model, batch):
        x, time, event = batch
        risk = model(x)                                   # (N, 1)
        if fixed:
            risk = risk.squeeze(-1)
        order = torch.argsort(time, descending=True)
        risk, ev = risk[order], event[order]
        log_cum = torch.logcumsumexp(risk, dim=0)
        return -((risk - log_cum) * ev).sum() / ev.sum()
    return loss_fn


@case("cox_risk_column_times_event_row", "shapes",
      "The DeepSurv risk head returns (N, 1) while the event indicator is (N,): (risk - logcumsumexp(risk)) * event "
      "broadcasts to (N, N), and summed over it every subject's partial-likelihood term is counted once per event in "
      "the batch, censored ones included, so the censoring indicator is effectively ignored.",
      r"censor.{0,60}(ignored|no effect|treated as|counted as)|event (indicator|mask|status).{0,80}(ignored|no "
      r"effect|not applied|broadcast|\(N,\))|every (subject|sample|patient).{0,60}(counted|treated) as (an )?event|"
      r"(partial|cox|survival).{0,60}(likelihood|loss).{0,80}broadcast|broadcast.{0,80}(partial|cox|risk score|"
      r"event|survival)")
def cox_risk_column_times_event_row(fixed=False):
    seed(0)
    train, val = survival_loaders(s=40, censor_rate=1.2, censor_feature=3)
    model = risk_mlp()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4),
                train_loader=train, val_loader=val, loss_fn=deepsurv_loss(fixed), max_steps=300)


fix("cox_risk_column_times_event_row", fixed_of(cox_risk_column_times_event_row), cindex_of(cox_fwd),
    "val C-index")
