"""Set aa, healthy: runs that must raise no warning. Five are the corrected twins of broken cases (the same builder
with the one-line fix); five are unusual but correct setups of the kind vision / audio / sensor users run."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_aa.cases_data import SessionDataset, machine_sessions, pad_collate
from benchmarks.blind_preflight_aa.cases_mechanics import ToneNet, lambdalr_absolute_lr
from benchmarks.blind_preflight_aa.cases_shapes import bigru_hidden_view, seg_logits_view_nchw
from benchmarks.blind_preflight_aa.cases_targets import mask_totensor_scaled
from benchmarks.blind_preflight_aa.cases_trained import color_patch_images, head_swapped_after_optimizer
from benchmarks.blind_preflight_aa.registry import gen, healthy, loader, rect_scenes, seed, tone_clips, twin

# ------------------------------------------------------------------------------------------------ corrected twins

healthy("seg_logits_view_nchw_fixed",
        "Segmentation FCN whose per-pixel cross-entropy permutes the logits to (N, H, W, C) before flattening.")(
    twin(seg_logits_view_nchw))
healthy("bigru_hidden_view_fixed",
        "Bidirectional GRU on IMU windows whose head reads torch.cat([h_n[0], h_n[1]], dim=1).")(
    twin(bigru_hidden_view))
healthy("mask_totensor_scaled_fixed",
        "Segmentation tiles whose class-id masks are converted with torch.from_numpy(...).long(), not ToTensor.")(
    twin(mask_totensor_scaled))
healthy("head_swapped_after_optimizer_fixed",
        "Frozen 'pretrained' backbone (on purpose) with the new 4-class head created before the optimizer on it.")(
    twin(head_swapped_after_optimizer))
healthy("lambdalr_absolute_lr_fixed",
        "Patch classifier with a 50-step LambdaLR warm-up whose lambda returns a factor in (0, 1].")(
    twin(lambdalr_absolute_lr))


# ------------------------------------------------------------------------------------------------ unusual but correct

class PixelDict(Dataset):
    """Hugging Face style batches: {'pixel_values', 'labels'}."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i]}


@healthy("hf_vit_tiny_from_config",
         "A tiny ViTForImageClassification built from a ViTConfig (no download), dict batches, loss from "
         "model(**batch).loss, AdamW with a linear warm-up factor.")
def hf_vit_tiny_from_config():
    from transformers import ViTConfig, ViTForImageClassification

    seed(0)
    x, y = color_patch_images(896, s=61)
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64, num_labels=4)
    model = ViTForImageClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(PixelDict(x[:768], y[:768]), 32),
                val_loader=loader(PixelDict(x[768:], y[768:]), 128, shuffle=False),
                loss_fn=None, max_steps=1500)


class FrozenFrontEnd(nn.Module):
    """A 'pretrained' filter-bank front end with BatchNorm, frozen on purpose (BN kept in eval mode), and a new head."""

    def __init__(self, classes: int = 4):
        super().__init__()
        g = gen(97)
        self.frontend = nn.Sequential(nn.Conv1d(1, 32, 15, padding=7, bias=False), nn.BatchNorm1d(32), nn.ReLU(),
                                      nn.AdaptiveAvgPool1d(1), nn.Flatten())
        with torch.no_grad():
            t = torch.arange(15).float()
            freqs = torch.linspace(0.04, 0.36, 16)
            w = torch.cat([torch.sin(2 * math.pi * freqs[:, None] * t), torch.cos(2 * math.pi * freqs[:, None] * t)])
            self.frontend[0].weight.copy_(w[:, None, :] * 0.3 + 0.01 * torch.randn(32, 1, 15, generator=g))
            self.frontend[1].running_mean.zero_()
            self.frontend[1].running_var.fill_(0.5)
        for p in self.frontend.parameters():
            p.requires_grad = False
        self.head = nn.Linear(32, classes)

    def train(self, mode: bool = True):
        super().train(mode)
        self.frontend.eval()                                    # frozen BN statistics stay as loaded
        return self

    def forward(self, clips):
        return self.head(self.frontend(clips))


@healthy("frozen_bn_frontend_head_only",
         "Audio classifier with a frozen, BatchNorm-carrying front end kept in eval mode by a train() override and "
         "an optimizer over the new head only.")
def frozen_bn_frontend_head_only():
    seed(0)
    x, y = tone_clips(896, s=62)
    model = FrozenFrontEnd()
    return dict(model=model, optimizer=torch.optim.Adam(model.head.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x[:768], y[:768]), 32),
                val_loader=loader(TensorDataset(x[768:], y[768:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


class SegAndTag(nn.Module):
    """Shared encoder, a per-pixel segmentation head and an image-level 'contains a large class-2 region' head."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.seg = nn.Conv2d(16, 3, 1)
        self.tag = nn.Linear(16, 1)

    def forward(self, x):
        h = self.encoder(x)
        return self.seg(h), self.tag(h.mean((2, 3))).squeeze(-1)


def seg_and_tag_loss(model, batch):
    img, mask, tag = batch
    seg_logits, tag_logit = model(img)
    seg = F.cross_entropy(seg_logits, mask)
    return seg + 0.5 * F.binary_cross_entropy_with_logits(tag_logit, tag)


@healthy("multitask_seg_and_tag",
         "Two-head model (per-pixel cross-entropy on (N, C, H, W) logits plus an image-level BCE tag) with one "
         "weighted loss from loss_fn(model, batch).")
def multitask_seg_and_tag():
    seed(0)
    x, m = rect_scenes(768, s=63)
    tag = ((m == 2).float().mean((1, 2)) > 0.12).float()
    model = SegAndTag()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:640], m[:640], tag[:640]), 32),
                val_loader=loader(TensorDataset(x[640:], m[640:], tag[640:]), 64, shuffle=False),
                loss_fn=seg_and_tag_loss, max_steps=1500)


class PackedSessionGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(2, 32, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, h = self.gru(packed)
        return self.head(h[-1])


def packed_ce(model, batch):
    x, lengths, y = batch
    return F.cross_entropy(model(x, lengths), y)


@healthy("packed_gru_sessions",
         "Variable-length machine sessions padded by a collate function and packed with "
         "pack_padded_sequence(enforce_sorted=False); the GRU's h_n[-1] is each session's last real step.")
def packed_gru_sessions():
    seed(0)
    seqs, y = machine_sessions(1024, s=64)
    model = PackedSessionGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(SessionDataset(seqs[:896], y[:896]), 32, collate_fn=pad_collate),
                val_loader=loader(SessionDataset(seqs[896:], y[896:]), 128, shuffle=False, collate_fn=pad_collate),
                loss_fn=packed_ce, max_steps=1500)


@healthy("bf16_accum_two_lr_audio",
         "Audio CNN under bf16 autocast with 4-step gradient accumulation, clipping at 1.0, AdamW with two learning "
         "rates (front end / head), a warm-up + cosine LambdaLR and label smoothing 0.1.")
def bf16_accum_two_lr_audio():
    seed(0)
    x, y = tone_clips(1152, s=65)
    model = ToneNet()
    optimizer = torch.optim.AdamW([{"params": model.features.parameters(), "lr": 1e-3},
                                   {"params": model.head.parameters(), "lr": 3e-3}], weight_decay=0.01)
    total, warm = 600, 30

    def factor(step):
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / (total - warm))))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(x[:1024], y[:1024]), 16),
                val_loader=loader(TensorDataset(x[1024:], y[1024:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1), precision="bf16", accumulation_steps=4,
                clip_grad_norm=1.0, max_steps=total)
