"""Targets: labels, boxes, heatmaps and masks that do not say what the model is scored on."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aq.registry import (
    BoxNet,
    CtcNet,
    DepthNet,
    KpNet,
    SegNet,
    box_data,
    box_metric,
    case,
    ctc_dataset,
    ctc_metric,
    depth_data,
    fix,
    fixed_of,
    giou_loss,
    kp_data,
    kp_metric,
    loader,
    rmse_metric,
    seed,
    seg_data,
    seg_metric,
)


@case("ctc_blank_is_a_character", "targets",
      bug="The transcripts are encoded 0-based (Keras style, character 'a' = 0) while nn.CTCLoss keeps its default "
          "blank=0, so the first character is the CTC blank and can never be emitted; shift labels by one or set "
          "blank to the last index.",
      cause_pattern=r"(?i)(blank.{0,80}(0|zero|collid|same (index|id)|also a (real )?(character|label|class)|"
                    r"last index|num_classes ?- ?1)|(label|character|target)s?.{0,60}(0.?based|start at 0|"
                    r"include (index )?0|use (index )?0).{0,60}blank|(shift|offset).{0,30}(by|\+) ?1.{0,40}blank)")
def ctc_blank_is_a_character(fixed=False):
    seed(0)
    model = CtcNet()
    first = 1 if fixed else 0
    ctc = nn.CTCLoss(zero_infinity=True)

    def loss_fn(m, batch):
        feats, targets, ilen, tlen = batch
        return ctc(m(feats).log_softmax(-1).transpose(0, 1).float(), targets, ilen, tlen)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ctc_dataset(960, 0, first_label=first), 32), loss_fn=loss_fn,
                val_loader=loader(ctc_dataset(240, 1, first_label=first), 32, shuffle=False), max_steps=300)


fix("ctc_blank_is_a_character", fixed_of(ctc_blank_is_a_character), ctc_metric(), "val 1-CER")


def gaussian_targets(kp, fixed, size=16, sigma=1.5):
    xs = torch.arange(size).float()
    ys = torch.arange(size).float()
    # numpy habit: np.meshgrid(xs, ys) is "xy"; torch.meshgrid defaults to "ij"
    gx, gy = torch.meshgrid(xs, ys, indexing="xy" if fixed else "ij")
    kx, ky = kp[:, 0].float().view(-1, 1, 1), kp[:, 1].float().view(-1, 1, 1)
    return torch.exp(-((gx - kx) ** 2 + (gy - ky) ** 2) / (2 * sigma ** 2)).unsqueeze(1)


@case("kp_heatmap_xy_swapped", "targets",
      bug="The Gaussian target heatmaps are built with torch.meshgrid(xs, ys) in its default 'ij' indexing (numpy's "
          "meshgrid is 'xy'), so every target peak sits at (y, x) instead of (x, y): the heatmap is transposed.",
      cause_pattern=r"(?i)(meshgrid.{0,80}(indexing|ij|xy|transpos|swap)|(heatmap|target|peak|keypoint).{0,80}"
                    r"(transpos|swapp?ed|\(y, ?x\)|x and y)|(x|y).{0,10}(and|/) ?(y|x) (coordinates? )?(are )?swapped)")
def kp_heatmap_xy_swapped(fixed=False):
    seed(0)
    x, kp = kp_data(1000, 0)
    vx, vkp = kp_data(250, 1)
    hm, vhm = gaussian_targets(kp, fixed), gaussian_targets(vkp, fixed)
    model = KpNet()

    def loss_fn(m, batch):
        images, _, heat = batch
        return F.mse_loss(m(images), heat) * 100

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, kp, hm), 32), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(vx, vkp, vhm), 64, shuffle=False), max_steps=300)


fix("kp_heatmap_xy_swapped", fixed_of(kp_heatmap_xy_swapped), kp_metric(lambda m, b: (m(b[0]), b[1])), "val PCK")


@case("box_xywh_targets_giou", "targets",
      bug="The training boxes were converted to COCO (x, y, w, h) while the GIoU loss and the model's output use "
          "corner (x1, y1, x2, y2) boxes, so the model is trained towards widths and heights as corners.",
      cause_pattern=r"(?i)(xywh|x, ?y, ?w, ?h|cxcywh|box (format|convention|encoding)|coco.{0,40}(format|boxes)|"
                    r"width.{0,20}height.{0,60}(corner|x2|xyxy)|xyxy|x1, ?y1, ?x2, ?y2)")
def box_xywh_targets_giou(fixed=False):
    seed(0)
    x, b = box_data(1200, 0)
    vx, vb = box_data(300, 1)
    if not fixed:
        b = torch.cat([b[:, :2], b[:, 2:] - b[:, :2]], 1)   # "COCO format" for the dataset json
    model = BoxNet()

    def loss_fn(m, batch):
        images, boxes = batch
        p = m(images).float()
        return giou_loss(p, boxes) + F.l1_loss(p, boxes)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, b), 32), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(vx, vb), 64, shuffle=False), max_steps=300)


fix("box_xywh_targets_giou", fixed_of(box_xywh_targets_giou), box_metric(), "val mean IoU")


@case("seg_mask_totensor_scaled", "targets",
      bug="The uint8 class-id masks go through a ToTensor-style conversion that divides by 255, and .long() then "
          "truncates every label to 0, so the segmentation model is trained on all-background masks.",
      cause_pattern=r"(?i)(to_?tensor.{0,80}mask|mask.{0,80}(to_?tensor|/ ?255|div\w*\(?.{0,10}255|all.{0,10}"
                    r"(zero|background|0))|(divid|scal)\w*.{0,20}255.{0,80}(label|mask|class)|"
                    r"(label|class).{0,40}truncat\w*.{0,20}(to )?0|pil_to_tensor|as_tensor\(np\.array)")
def seg_mask_totensor_scaled(fixed=False):
    seed(0)
    x, m = seg_data(1000, 4)
    vx, vm = seg_data(250, 5)
    raw = m.to(torch.uint8)                      # as read from the palette PNGs
    masks = raw.long() if fixed else (raw.float() / 255.0).long()
    model = SegNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, masks), 32), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(vx, vm), 64, shuffle=False), max_steps=300)


fix("seg_mask_totensor_scaled", fixed_of(seg_mask_totensor_scaled), seg_metric(), "val pixel acc")


@case("depth_sigmoid_head", "targets",
      bug="The depth head ends in a sigmoid, so predictions are confined to (0, 1) while the depth targets are "
          "metres between 1 and 5; the model can never reach them.",
      cause_pattern=r"(?i)(sigmoid.{0,100}(range|\(0, ?1\)|\[0, ?1\]|metre|meter|bounded|saturat|cannot reach|"
                    r"can never reach)|(target|depth)s?.{0,80}(outside|beyond|exceed).{0,40}(range|sigmoid|\(0, ?1\))|"
                    r"output (range|activation).{0,60}(target|depth))")
def depth_sigmoid_head(fixed=False):
    seed(0)
    x, d = depth_data(800, 2)
    vx, vd = depth_data(200, 3)
    model = DepthNet(act=None if fixed else nn.Sigmoid())
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, d.unsqueeze(1)), 32), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(vx, vd.unsqueeze(1)), 64, shuffle=False), max_steps=300)


fix("depth_sigmoid_head", fixed_of(depth_sigmoid_head), rmse_metric(), "val RMSE (m)", higher=False)
