"""Healthy: 5 corrected twins of broken cases and 5 unusual-but-correct multimodal / geometric / fine-tuning setups."""

from __future__ import annotations

import math

import torch
from torch import nn

from benchmarks.blind_preflight_at.cases_data import video_frames_sampled_unsorted
from benchmarks.blind_preflight_at.cases_mechanics import param_group_lr_key_typo
from benchmarks.blind_preflight_at.cases_shapes import pc_view_not_transpose
from benchmarks.blind_preflight_at.cases_targets import clip_collate_sorts_captions
from benchmarks.blind_preflight_at.cases_trained import head_swapped_after_optimizer
from benchmarks.blind_preflight_at.registry import (
    DualEncoder,
    FTNet,
    LoRALinear,
    Pairs,
    Video3D,
    caption_loaders,
    clip_loss,
    ft_loaders,
    gen,
    healthy,
    loader,
    moving_blobs,
    point_clouds,
    seed,
    twin,
)

healthy("pc_view_not_transpose_fixed", "PointNet with pts.transpose(1, 2) into Conv1d")(twin(pc_view_not_transpose))
healthy("clip_collate_sorts_captions_fixed",
        "length-sorting collate that reorders the images with the captions")(twin(clip_collate_sorts_captions))
healthy("head_swapped_after_optimizer_fixed",
        "linear probe whose optimizer is built after the head swap")(twin(head_swapped_after_optimizer))
healthy("video_frames_sampled_unsorted_fixed",
        "random frame sampling with sorted indices")(twin(video_frames_sampled_unsorted))
healthy("param_group_lr_key_typo_fixed",
        "two AdamW groups, head group with its own 'lr'")(twin(param_group_lr_key_typo))


class PointMLP(nn.Module):
    """PointNet written channels-last: nn.Linear on (B, N, 3) per point, max over the point dimension (dim=1)."""

    def __init__(self):
        super().__init__()
        self.point = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 64), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))

    def forward(self, pts):
        return self.head(self.point(pts).max(dim=1).values)


class MirrorZ(torch.utils.data.Dataset):
    """Random mirror of z (every class is symmetric under it) and a random point order per item."""

    def __init__(self, pts, y, s):
        self.pts, self.y, self.g = pts, y, gen(s)

    def __len__(self):
        return len(self.pts)

    def __getitem__(self, i):
        p = self.pts[i][torch.randperm(self.pts.shape[1], generator=self.g)]
        if torch.rand(1, generator=self.g).item() < 0.5:
            p = p * torch.tensor([1.0, 1.0, -1.0])
        return p, self.y[i]


@healthy("pc_channels_last_linear_mirror_aug",
         "channels-last PointNet (nn.Linear on (B, N, 3), max over dim=1) with z-mirror and point-order augmentation")
def pc_channels_last_linear_mirror_aug():
    seed(0)
    pts, y, _ = point_clouds(1280, s=61)
    pts = pts - pts.mean(1, keepdim=True)
    model = PointMLP()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 1e-3),
                train_loader=loader(MirrorZ(pts[:1024], y[:1024], 62), 32),
                val_loader=loader(Pairs(pts[1024:], y[1024:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


@healthy("clip_bf16_learnable_temperature",
         "CLIP-style dual encoder under bf16, learnable clamped logit_scale kept out of weight decay")
def clip_bf16_learnable_temperature():
    seed(0)
    tr, va, vocab = caption_loaders()
    model = DualEncoder(len(vocab) + 1, scale=1 / 0.07)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=2e-3)
    return dict(model=model, optimizer=opt, train_loader=tr, val_loader=va, loss_fn=clip_loss, precision="bf16",
                max_steps=200)


@healthy("video_conv3d_accum_cosine",
         "Conv3d on (B, C, T, H, W) clips, 2-step accumulation, clipping, cosine schedule sized to max_steps")
def video_conv3d_accum_cosine():
    seed(0)
    vid, y, _ = moving_blobs(768, frames=6, s=63)
    vid = vid.permute(0, 4, 1, 2, 3).contiguous()
    model = Video3D()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    return dict(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=200),
                train_loader=loader(Pairs(vid[:640], y[:640]), 16),
                val_loader=loader(Pairs(vid[640:], y[640:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), accumulation_steps=2, clip_grad_norm=1.0, max_steps=200)


@healthy("lora_frozen_backbone_two_groups",
         "frozen 'pretrained' backbone, LoRA (A random, B zero) on its first layer, new head, two AdamW groups")
def lora_frozen_backbone_two_groups():
    seed(0)
    tr, va = ft_loaders(use_first=True)
    model = FTNet()
    for p in model.backbone.parameters():
        p.requires_grad = False
    model.backbone.fc1 = LoRALinear(model.backbone.fc1, r=4, alpha=8)
    lora = [p for n, p in model.named_parameters() if p.requires_grad and "backbone" in n]
    opt = torch.optim.AdamW([{"params": lora, "lr": 3e-3, "weight_decay": 0.0},
                             {"params": model.head.parameters(), "lr": 5e-3}])
    return dict(model=model, optimizer=opt, train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss(),
                max_steps=200)


@healthy("layerwise_lr_warmup_cosine",
         "full fine-tune with layer-wise learning rates (deeper = larger) and a warm-up + cosine LambdaLR sized to "
         "max_steps")
def layerwise_lr_warmup_cosine():
    seed(0)
    tr, va = ft_loaders(use_first=True)
    model = FTNet()
    opt = torch.optim.AdamW([{"params": model.backbone.fc1.parameters(), "lr": 1.5e-3},
                             {"params": model.backbone.fc2.parameters(), "lr": 2e-3},
                             {"params": model.head.parameters(), "lr": 3e-3}])
    steps, warm = 200, 20

    def factor(s):
        if s < warm:
            return (s + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (s - warm) / (steps - warm)))
    return dict(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, factor),
                train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss(), max_steps=steps)
