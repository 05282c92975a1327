"""Healthy: 5 corrected twins of broken cases and 5 unusual-but-correct detection / dense / CTC setups."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_aq.cases_data import box_hflip_image_only, ctc_sorted_features_not_transcripts
from benchmarks.blind_preflight_aq.cases_shapes import ctc_batch_first_layout
from benchmarks.blind_preflight_aq.cases_targets import seg_mask_totensor_scaled
from benchmarks.blind_preflight_aq.cases_trained import ctc_freeze_by_name_substring
from benchmarks.blind_preflight_aq.registry import (
    BoxNet,
    DepthNet,
    KpNet,
    box_data,
    ctc_dataset,
    depth_data,
    gen,
    giou_loss,
    healthy,
    heatmap,
    kp_data,
    loader,
    seed,
    seg_data,
    twin,
)

healthy("ctc_batch_first_layout_fixed", "Batch-first CTC log-probabilities transposed to (T, N, C) before "
        "nn.CTCLoss.")(twin(ctc_batch_first_layout))
healthy("seg_mask_totensor_scaled_fixed", "uint8 class-id masks converted with .long(), no division by "
        "255.")(twin(seg_mask_totensor_scaled))
healthy("box_hflip_image_only_fixed", "Random horizontal flip that mirrors the boxes with the "
        "image.")(twin(box_hflip_image_only))
healthy("ctc_sorted_features_not_transcripts_fixed", "Utterances sorted by duration with their transcripts "
        "reordered alike.")(twin(ctc_sorted_features_not_transcripts))
healthy("ctc_freeze_by_name_substring_fixed", "Only the feature_conv front end frozen (startswith), encoder and "
        "classifier trained.")(twin(ctc_freeze_by_name_substring))


@healthy("ctc_blank_last_index", "CTC with 0-based characters and the blank at the last index: "
         "nn.CTCLoss(blank=C-1), targets padded with the blank id, GRU encoder, reduction='sum' / batch size.")
def ctc_blank_last_index():
    seed(0)
    feats, targets, ilen, tlen = ctc_dataset(960, 20, first_label=0).tensors
    blank = 5
    targets = torch.where(torch.arange(5) < tlen[:, None], targets, torch.full_like(targets, blank))

    class GruCtc(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(12, 32, batch_first=True, bidirectional=True)
            self.out = nn.Linear(64, 6)

        def forward(self, x):
            return self.out(self.gru(x)[0])

    model = GruCtc()
    ctc = nn.CTCLoss(blank=blank, reduction="sum", zero_infinity=True)

    def loss_fn(m, b):
        x, y, il, tl = b
        return ctc(m(x).log_softmax(-1).transpose(0, 1).float(), y, il, tl) / x.size(0)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(feats, targets, ilen, tlen), 32), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(*ctc_dataset(240, 21, first_label=0).tensors), 32, shuffle=False),
                max_steps=200, clip_grad_norm=5.0)


@healthy("seg_ignore_index_borders", "Segmentation with 255 'void' pixels on object borders and "
         "CrossEntropyLoss(ignore_index=255), class weights for the rare classes.")
def seg_ignore_index_borders():
    seed(0)
    x, m = seg_data(1000, 22)
    grown = F.max_pool2d(m[:, None].float(), 3, 1, 1)[:, 0].long()
    void = (grown != m)
    m = torch.where(void, torch.full_like(m, 255), m)
    from benchmarks.blind_preflight_aq.registry import SegNet
    model = SegNet()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4),
                train_loader=loader(TensorDataset(x, m), 32),
                loss_fn=lambda mod, b: F.cross_entropy(
                    mod(b[0]), b[1], ignore_index=255,
                    weight=torch.tensor([0.5, 2.0, 2.0], device=b[0].device)),
                max_steps=200)


@healthy("depth_log_scale_invariant", "Depth predicted in log space with the scale-invariant log loss "
         "(lambda 0.85), exp at inference, SGD with Nesterov momentum and a cosine schedule.")
def depth_log_scale_invariant():
    seed(0)
    x, d = depth_data(800, 23)
    model = DepthNet()
    with torch.no_grad():
        model.head.bias.fill_(1.0)

    def loss_fn(m, b):
        images, depth = b
        diff = m(images).float() - depth.log()
        return (diff.pow(2).mean((1, 2, 3)) - 0.85 * diff.mean((1, 2, 3)).pow(2)).mean()

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=200),
                train_loader=loader(TensorDataset(x, d.unsqueeze(1)), 32), loss_fn=loss_fn, max_steps=200)


@healthy("kp_frozen_backbone_onecycle", "Keypoint heatmaps with a frozen backbone (requires_grad False, "
         "eval-mode BatchNorm), only the head in AdamW, OneCycleLR over exactly max_steps, bf16 autocast.")
def kp_frozen_backbone_onecycle():
    seed(0)
    x, kp = kp_data(1000, 24)
    model = KpNet(width=24)
    for p in model.backbone.parameters():
        p.requires_grad = False
    optimizer = torch.optim.AdamW(model.head.parameters(), lr=1e-2)
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=200),
                train_loader=loader(TensorDataset(x, kp, heatmap(kp[:, 0], kp[:, 1])), 32),
                loss_fn=lambda m, b: F.mse_loss(m(b[0]).float(), b[2]) * 100, precision="bf16", max_steps=200)


class FlipBoth(Dataset):
    def __init__(self, x, b, s=0):
        self.x, self.b = x, b
        self.g = gen(s)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        img, box = self.x[i], self.b[i]
        if torch.rand(1, generator=self.g).item() < 0.5:
            img, box = img.flip(-1), torch.stack([1 - box[2], box[1], 1 - box[0], box[3]])
        return img, box


@healthy("box_giou_sigmoid_accum", "Box regression with sigmoid-decoded corners, GIoU + L1 loss, flips that move "
         "the boxes, 2-step gradient accumulation and clipping at 1.0.")
def box_giou_sigmoid_accum():
    seed(0)
    x, b = box_data(1200, 25)
    model = BoxNet()

    def loss_fn(m, batch):
        images, boxes = batch
        raw = m(images).float().sigmoid()
        p = torch.cat([torch.minimum(raw[:, :2], raw[:, 2:]), torch.maximum(raw[:, :2], raw[:, 2:])], 1)
        return giou_loss(p, boxes) + 5 * F.l1_loss(p, boxes)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(FlipBoth(x, b), 16), loss_fn=loss_fn, accumulation_steps=2,
                clip_grad_norm=1.0, max_steps=200)


