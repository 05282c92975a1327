"""Targets: what the dense / box / survival labels mean (background id, box format, heatmap stride, the event
indicator, box coordinates after a resize)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_bd import synth
from benchmarks.blind_preflight_bd.common import BoxRegressor, HeatmapNet, TinyUNet, cox_fwd, cox_ph_loss, risk_mlp
from benchmarks.blind_preflight_bd.registry import case, cindex_of, fix, fixed_of, iou_of, loader, miou_of, pck_of, seed


# --- 1. background class 0 passed as ignore_index -----------------------------------------------------------------
@case("seg_background_passed_as_ignore_index", "targets",
      "CrossEntropyLoss(ignore_index=0) was meant to 'not reward predicting background', but 0 is the background "
      "class id of the masks: every background pixel is dropped from the loss, the UNet never sees a background "
      "target and labels the whole image as square or disc.",
      r"ignore_index\s*=\s*0|ignore_index.{0,60}background|background.{0,80}(ignored|never (learned|seen|trained)|"
      r"excluded|dropped|masked out|no (loss|gradient))|(never|cannot) predict.{0,20}background|class (id |index )?"
      r"0.{0,60}(ignored|excluded|background)|drop (the )?ignore_index|only (for|on) (void|unlabel)")
def seg_background_passed_as_ignore_index(fixed=False):
    seed(0)
    imgs, masks = synth.seg_shapes(640, s=60)
    vi, vm = synth.seg_shapes(256, s=61)
    model = TinyUNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(synth.t(imgs), synth.t(masks)), 16),
                val_loader=loader(TensorDataset(synth.t(vi), synth.t(vm)), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss() if fixed else nn.CrossEntropyLoss(ignore_index=0), max_steps=300)


def _seg_fwd(m, b):
    return m(b[0]), b[1]


fix("seg_background_passed_as_ignore_index", fixed_of(seg_background_passed_as_ignore_index), miou_of(_seg_fwd),
    "val mIoU")


# --- 2. COCO-style xywh boxes fed to a GIoU loss written for xyxy --------------------------------------------------
def giou_loss(pred, target):
    """Generalised IoU loss for boxes as (x0, y0, x1, y1)."""
    x0 = torch.maximum(pred[:, 0], target[:, 0])
    y0 = torch.maximum(pred[:, 1], target[:, 1])
    x1 = torch.minimum(pred[:, 2], target[:, 2])
    y1 = torch.minimum(pred[:, 3], target[:, 3])
    inter = (x1 - x0).clamp(min=0) * (y1 - y0).clamp(min=0)
    area_p = (pred[:, 2] - pred[:, 0]).clamp(min=0) * (pred[:, 3] - pred[:, 1]).clamp(min=0)
    area_t = (target[:, 2] - target[:, 0]).clamp(min=0) * (target[:, 3] - target[:, 1]).clamp(min=0)
    union = area_p + area_t - inter + 1e-7
    cx0 = torch.minimum(pred[:, 0], target[:, 0])
    cy0 = torch.minimum(pred[:, 1], target[:, 1])
    cx1 = torch.maximum(pred[:, 2], target[:, 2])
    cy1 = torch.maximum(pred[:, 3], target[:, 3])
    hull = (cx1 - cx0) * (cy1 - cy0) + 1e-7
    giou = inter / union - (hull - union) / hull
    return (1 - giou).mean() + F.l1_loss(pred, target)


class CocoBoxes(Dataset):
    """Annotations as COCO gives them: bbox = [x, y, width, height] in pixels."""

    def __init__(self, n, s, fixed, size=32):
        self.imgs, xyxy = synth.box_images(n, size=size, s=s)
        self.coco = np.concatenate([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]], 1)   # xywh, as stored on disk
        self.xyxy = xyxy
        self.size, self.fixed = size, fixed

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        x, y, w, h = self.coco[i]
        box = np.array([x, y, x + w, y + h] if self.fixed else [x, y, w, h], np.float32) / self.size
        return torch.from_numpy(self.imgs[i]), torch.from_numpy(box), torch.from_numpy(self.xyxy[i])


def _giou_fn(model, batch):
    imgs, box, _ = batch
    return giou_loss(model(imgs), box)


@case("box_coco_xywh_into_xyxy_giou", "targets",
      "The annotations are COCO [x, y, width, height] but the GIoU loss and the decoder read them as (x0, y0, x1, y1): "
      "wherever width < x (most boxes) the target is a degenerate box with x1 < x0, the loss has no overlap to "
      "reward and the regressor learns corners that are really a width and a height.",
      r"xywh|xyxy|cxcywh|box (format|convention)|\[x,\s*y,\s*w(idth)?,\s*h(eight)?\]|width and height.{0,40}(as|"
      r"instead of|not).{0,20}(corner|x1|x2|x_?max)|(corner|x1|x2|xmax).{0,60}(width|height)|convert.{0,40}"
      r"(xywh|to corners|x \+ w)|x\s*\+\s*w|degenerate box|x1\s*<\s*x0|coco.{0,40}(format|bbox)")
def box_coco_xywh_into_xyxy_giou(fixed=False):
    seed(0)
    model = BoxRegressor()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(CocoBoxes(800, 70, fixed), 16),
                val_loader=loader(CocoBoxes(256, 71, fixed), 64, shuffle=False),
                loss_fn=_giou_fn, max_steps=300)


def _box_fwd(m, b):
    return m(b[0]) * 32, b[2]


fix("box_coco_xywh_into_xyxy_giou", fixed_of(box_coco_xywh_into_xyxy_giou), iou_of(_box_fwd), "val box IoU")


# --- 3. CenterNet target peaks placed at input-pixel coordinates on the stride-2 output -------------------------
STRIDE = 2


class CentreHeatmaps(Dataset):
    def __init__(self, n, s, fixed):
        self.imgs, self.ctr = synth.blob_centers(n, s=s)
        # the output map is 16x16 (stride 2); the Gaussian centre must be the centre / stride
        self.hm = synth.gaussian_heatmap(self.ctr, 16, STRIDE if fixed else 1)

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        return torch.from_numpy(self.imgs[i]), torch.from_numpy(self.hm[i]), torch.from_numpy(self.ctr[i])


def focal(pred_logits, gt, alpha=2, beta=4):
    pred = torch.sigmoid(pred_logits.float()).clamp(1e-4, 1 - 1e-4)
    pos = gt.eq(1).float()
    pos_loss = torch.log(pred) * (1 - pred) ** alpha * pos
    neg_loss = torch.log(1 - pred) * pred ** alpha * (1 - gt) ** beta * (1 - pos)
    return -(pos_loss.sum() + neg_loss.sum()) / pos.sum().clamp(min=1)


def _focal_fn(model, batch):
    imgs, hm, _ = batch
    return focal(model(imgs), hm.unsqueeze(1))


def _decode(hm):
    n, _, h, w = hm.shape
    idx = hm.reshape(n, -1).argmax(1)
    return torch.stack([(idx % w).float(), (idx // w).float()], 1) * STRIDE + STRIDE / 2


@case("centernet_peak_not_divided_by_stride", "targets",
      "The Gaussian targets are drawn at the object centre in input pixels on the stride-2 (16x16) output map "
      "instead of at centre / stride: peaks land at twice their place, every centre past pixel 16 falls off the "
      "map or is clamped to its edge, and the heatmap head learns positions the decoder (argmax * stride) misreads.",
      r"stride|output (resolution|map|size)|downsampl|centre ?/ ?stride|center ?/ ?stride|divide.{0,40}(by|the) "
      r"(stride|(down)?sampl)|(input|image) (pixel|resolution|coordinates).{0,60}(heatmap|output)|twice|off the "
      r"(map|heatmap)|(heatmap|target) (coordinates|peaks?).{0,40}(scale|wrong|misplaced)")
def centernet_peak_not_divided_by_stride(fixed=False):
    seed(0)
    model = HeatmapNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(CentreHeatmaps(800, 80, fixed), 16),
                val_loader=loader(CentreHeatmaps(256, 81, fixed), 64, shuffle=False),
                loss_fn=_focal_fn, max_steps=300)


def _hm_fwd(m, b):
    return _decode(m(b[0])), b[2]


fix("centernet_peak_not_divided_by_stride", fixed_of(centernet_peak_not_divided_by_stride), pck_of(_hm_fwd),
    "val PCK@3px")


# --- 4. the censoring flag passed where the Cox loss expects the event flag ---------------------------------------
class RegistryExtract(Dataset):
    """A registry export: columns features..., followup_days, censored (1 = alive at last contact)."""

    def __init__(self, n, s, fixed):
        x, t, e, _ = synth.survival_table(n, s=s, censor_rate=0.8, censor_feature=3)
        self.x, self.t = x, t
        self.censored = (1 - e).astype(np.float32)
        self.fixed = fixed

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        status = 1.0 - self.censored[i] if self.fixed else self.censored[i]
        return torch.from_numpy(self.x[i]), torch.tensor(self.t[i]), torch.tensor(status)


def _cox_fn(model, batch):
    x, time, event = batch
    return cox_ph_loss(model(x).squeeze(-1), time, event)


@case("cox_censored_flag_used_as_event", "targets",
      "The registry's 'censored' column (1 = alive at last contact) is passed to the Cox partial likelihood as the "
      "event indicator: the loss's numerator terms are the censored subjects and the deaths are treated as "
      "censored, so the model learns who drops out of follow-up rather than who dies early.",
      r"censor.{0,80}(event|indicator|flag|status)|event.{0,60}(indicator|flag|status).{0,60}(inverted|flipped|"
      r"reversed|swapped|1\s*-|wrong|censor)|1\s*-\s*censored|(inverted|flipped|reversed) (event|censoring)|deaths? "
      r"(are |is )?treated as censored")
def cox_censored_flag_used_as_event(fixed=False):
    seed(0)
    xv, _, _, tv = synth.survival_table(600, s=91)
    model = risk_mlp()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4),
                train_loader=loader(RegistryExtract(1200, 90, fixed), 64),
                val_loader=loader(TensorDataset(synth.t(xv), synth.t(tv), torch.ones(600)), 200, shuffle=False),
                loss_fn=_cox_fn, max_steps=300)


fix("cox_censored_flag_used_as_event", fixed_of(cox_censored_flag_used_as_event), cindex_of(cox_fwd), "val C-index")


# --- 5. images downscaled in the Dataset, boxes left in the original pixel grid -----------------------------------
class ScaledBoxes(Dataset):
    """Scans rendered at 64x64, downscaled to 32x32 for the model; boxes normalised by the model's input size."""

    def __init__(self, n, s, fixed):
        imgs, boxes = synth.box_images(n, size=64, s=s)
        self.imgs = F.interpolate(torch.from_numpy(imgs), size=(32, 32), mode="bilinear", align_corners=False,
                                  antialias=True)
        self.boxes = torch.from_numpy(boxes)                 # xyxy in 64-pixel coordinates
        self.true = self.boxes / 2                           # the same boxes on the 32x32 image
        self.fixed = fixed

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        box = self.boxes[i] * (32 / 64) if self.fixed else self.boxes[i]
        return self.imgs[i], box / 32, self.true[i]


def _l1_fn(model, batch):
    imgs, box, _ = batch
    return F.smooth_l1_loss(model(imgs), box, beta=0.05)


@case("box_image_resized_boxes_not", "targets",
      "The Dataset downsizes the 64x64 images to 32x32 but keeps the boxes in 64-pixel coordinates and normalises "
      "them by 32: the targets are twice too large (many above 1, out of the sigmoid head's reach), so the boxes "
      "the regressor learns are scaled and shifted away from the objects.",
      r"(resiz|rescal|downscal|downsampl|interpolat).{0,80}(box|coordinates|targets?)|(box|coordinates|targets?)"
      r".{0,80}(not (re)?scaled|original (image )?(size|resolution|pixel)|64)|scale (factor|the boxes)|"
      r"(twice|2x|two times) too (large|big)|above 1|out of (the )?\[0, ?1\]|outside (the )?(\[0, ?1\]|range (a|the) "
      r"sigmoid)|normali[sz]ed by the wrong")
def box_image_resized_boxes_not(fixed=False):
    seed(0)
    model = BoxRegressor()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(ScaledBoxes(800, 100, fixed), 16),
                val_loader=loader(ScaledBoxes(256, 101, fixed), 64, shuffle=False),
                loss_fn=_l1_fn, max_steps=300)


fix("box_image_resized_boxes_not", fixed_of(box_image_resized_boxes_not), iou_of(_box_fwd), "val box IoU")
