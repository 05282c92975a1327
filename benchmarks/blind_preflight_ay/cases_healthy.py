"""Healthy: 5 corrected twins of broken cases and 5 unusual-but-correct image pipelines (no warning expected)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_ay.cases_data import bgr_train_rgb_val
from benchmarks.blind_preflight_ay.cases_shapes import FiveCrop, count_head_broadcast, hflip_wrong_axis
from benchmarks.blind_preflight_ay.cases_targets import mixup_weights_swapped
from benchmarks.blind_preflight_ay.cases_trained import head_created_in_forward
from benchmarks.blind_preflight_ay.registry import (
    SmallCNN,
    TinyResNet,
    arrows,
    colour_blobs,
    dots,
    healthy,
    loader,
    seed,
    tensor_loaders,
    to_chw,
    twin,
)

healthy("hflip_wrong_axis_fixed", "Twin: the hand-written flip reverses the width axis (np.flip(img, axis=1)).")(
    twin(hflip_wrong_axis))
healthy("count_head_broadcast_fixed", "Twin: counts unsqueezed to (N, 1) to match the (N, 1) counting head.")(
    twin(count_head_broadcast))
healthy("mixup_weights_swapped_fixed", "Twin: mixup with lam * CE(y) + (1 - lam) * CE(y[perm]).")(
    twin(mixup_weights_swapped))
healthy("head_created_in_forward_fixed", "Twin: the classifier nn.Linear is built in __init__ and registered.")(
    twin(head_created_in_forward))
healthy("bgr_train_rgb_val_fixed", "Twin: training images converted BGR -> RGB like the validation images.")(
    twin(bgr_train_rgb_val))


class FrozenBNBackbone(nn.Module):
    """Fine-tuning with the stem and first stage frozen on purpose and their BatchNorms kept in eval mode."""

    def __init__(self):
        super().__init__()
        self.net = TinyResNet(out=10)
        self.net.fc = nn.Linear(32, 4)
        for m in (self.net.stem, self.net.layer1):
            m.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        self.net.stem.eval()
        self.net.layer1.eval()
        return self

    def forward(self, x):
        return self.net(x)


@healthy("frozen_stages_bn_eval_two_lr_groups",
         "Stem and layer1 frozen with their BatchNorms held in eval by a train() override; the rest trained with "
         "two AdamW groups (backbone 5e-4, new head 5e-3) and a linear warm-up sized for max_steps.")
def frozen_stages_bn_eval_two_lr_groups():
    seed(60)
    model = FrozenBNBackbone()
    img, y = colour_blobs(1600, s=61)
    x, y = to_chw(img), torch.from_numpy(y)
    tr, va = tensor_loaders(x[:1200], y[:1200], x[1200:], y[1200:])
    head = list(model.net.fc.parameters())
    body = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("net.fc.")]
    optimizer = torch.optim.AdamW([{"params": body, "lr": 5e-4}, {"params": head, "lr": 5e-3}], weight_decay=1e-4)
    max_steps = 300
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 30))
    return dict(model=model, optimizer=optimizer, train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss(),
                scheduler=scheduler, max_steps=max_steps)


def cutmix_loss(model, batch):
    x, y = batch
    lam = float(torch.distributions.Beta(1.0, 1.0).sample())
    perm = torch.randperm(x.size(0), device=x.device)
    h, w = x.shape[-2:]
    cut = math.sqrt(1 - lam)
    ch, cw = int(h * cut), int(w * cut)
    cy, cx = int(torch.randint(h, (1,))), int(torch.randint(w, (1,)))
    y0, y1 = max(cy - ch // 2, 0), min(cy + ch // 2, h)
    x0, x1 = max(cx - cw // 2, 0), min(cx + cw // 2, w)
    x = x.clone()
    x[:, :, y0:y1, x0:x1] = x[perm, :, y0:y1, x0:x1]
    lam = 1 - (y1 - y0) * (x1 - x0) / (h * w)  # the area actually kept after clipping the box
    out = model(x)
    return lam * F.cross_entropy(out, y) + (1 - lam) * F.cross_entropy(out, y[perm])


@healthy("cutmix_nesterov_onecycle",
         "CutMix with the label weight recomputed from the clipped box area, Nesterov SGD and OneCycleLR with "
         "total_steps = max_steps.")
def cutmix_nesterov_onecycle():
    seed(62)
    img, y = arrows(1600, s=63)
    x, y = to_chw(img), torch.from_numpy(y)
    tr, va = tensor_loaders(x[:1200], y[:1200], x[1200:], y[1200:])
    model = SmallCNN(4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    max_steps = 300
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=max_steps)
    return dict(model=model, optimizer=optimizer, train_loader=tr, val_loader=va, loss_fn=cutmix_loss,
                scheduler=scheduler, max_steps=max_steps)


@healthy("label_smoothing_accum_clip_cosine",
         "CrossEntropyLoss(label_smoothing=0.1) on a TinyResNet, 2-step accumulation of batches of 16, clipping at "
         "1.0 and a cosine schedule over max_steps.")
def label_smoothing_accum_clip_cosine():
    seed(64)
    img, y = colour_blobs(1600, s=65)
    x, y = to_chw(img), torch.from_numpy(y)
    tr, va = tensor_loaders(x[:1200], y[:1200], x[1200:], y[1200:], batch_size=16)
    model = TinyResNet(out=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    max_steps = 300
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max_steps)
    return dict(model=model, optimizer=optimizer, train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1), scheduler=scheduler, max_steps=max_steps,
                accumulation_steps=2, clip_grad_norm=1.0)


@healthy("bf16_count_regression_huber",
         "A dot-counting CNN under bf16 with nn.HuberLoss on (N, 1) count targets standardised with the train "
         "split's mean and std (the same transform for both splits).")
def bf16_count_regression_huber():
    seed(66)
    img, c = dots(1600, s=67)
    x, c = to_chw(img), torch.from_numpy(c).unsqueeze(1)
    mu, sd = c[:1200].mean(), c[:1200].std()
    t = (c - mu) / sd
    tr, va = tensor_loaders(x[:1200], t[:1200], x[1200:], t[1200:])
    model = SmallCNN(1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.HuberLoss(delta=1.0), precision="bf16", max_steps=300)


def five_crop_loss(model, batch):
    crops, y = batch
    k = crops.size(1)
    return F.cross_entropy(model(crops.flatten(0, 1)), y.repeat_interleave(k))


@healthy("five_crop_training_repeat_interleave",
         "Five-crop training: crops flattened to (B*5, C, H, W) with labels expanded by y.repeat_interleave(5); "
         "validation on single centre crops.")
def five_crop_training_repeat_interleave():
    seed(68)
    img, y = colour_blobs(1600, s=69)
    x, y = to_chw(img), torch.from_numpy(y)
    model = SmallCNN(4)
    tr = loader(FiveCrop(x[:1200], y[:1200]), 16)
    va = loader(torch.utils.data.TensorDataset(x[1200:, :, 2:14, 2:14], y[1200:]), 128, shuffle=False)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=five_crop_loss, max_steps=300)
