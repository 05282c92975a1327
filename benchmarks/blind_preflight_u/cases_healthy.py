"""Healthy: 5 corrected twins of broken cases (the same builder with its one-line fix) and 5 unusual but correct
vision setups. None should raise a warning or an error."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_u.cases_data import pose_flip
from benchmarks.blind_preflight_u.cases_mechanics import trap_microbatch
from benchmarks.blind_preflight_u.cases_shapes import lane_logits
from benchmarks.blind_preflight_u.cases_targets import swatch_folder
from benchmarks.blind_preflight_u.cases_trained import crop_band_mix
from benchmarks.blind_preflight_u.registry import healthy, loader, rng, seed, twin

healthy("lane_logits_permuted_fixed", "lane_logits_transpose_1_3 with logits.permute(0, 2, 3, 1) before the flatten")(
    twin(lane_logits))
healthy("swatch_folder_hidden_dirs_skipped_fixed",
        "swatch_folder_hidden_checkpoint_class with hidden folders skipped when listing classes")(twin(swatch_folder))
healthy("crop_band_mix_parameter_fixed", "crop_band_mix_registered_as_buffer with the mixing matrix an nn.Parameter")(
    twin(crop_band_mix))
healthy("trap_batch32_no_accumulation_fixed",
        "trap_batchnorm_microbatch_accumulation with batch_size=32 and no accumulation")(twin(trap_microbatch))
healthy("pose_flip_swaps_left_right_fixed", "pose_flip_without_left_right_swap with the wrists swapped on flips")(
    twin(pose_flip))


# --- CenterNet-style detector: a variable number of boxes per image, kept per image by the collate ---------------------

class ShelfProducts(Dataset):
    """Products on a shelf: 1-3 boxes per 24x24 image, as (x1, y1, x2, y2) in pixels."""

    def __init__(self, n, s):
        r = rng(s)
        self.images = r.normal(0.3, 0.05, (n, 3, 24, 24)).astype(np.float32)
        self.boxes = []
        for i in range(n):
            boxes = []
            for _ in range(r.integers(1, 4)):
                w, h = r.integers(3, 7, 2)
                x, y = r.integers(0, 24 - w), r.integers(0, 24 - h)
                self.images[i, :, y:y + h, x:x + w] = r.uniform(0.6, 1.0, (3, 1, 1))
                boxes.append([x, y, x + w, y + h])
            self.boxes.append(torch.tensor(boxes, dtype=torch.float32))
        self.images = torch.from_numpy(self.images)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.boxes[i]


def detection_collate(batch):
    images, boxes = zip(*batch)
    return torch.stack(images), list(boxes)


def centre_focal_loss(model, batch):
    images, boxes = batch
    out = model(images)                                   # (N, 1, 12, 12) centre logits at stride 2
    n, _, h, w = out.shape
    target = torch.zeros(n, 1, h, w, device=out.device)
    ys = torch.arange(h, device=out.device).view(h, 1).float()
    xs = torch.arange(w, device=out.device).view(1, w).float()
    for i, b in enumerate(boxes):
        b = b.to(out.device) / 2
        for cx, cy in zip((b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2):
            g = torch.exp(-((xs - cx) ** 2 + (ys - cy) ** 2) / 2.0)
            target[i, 0] = torch.maximum(target[i, 0], g)
    p = torch.sigmoid(out.float()).clamp(1e-4, 1 - 1e-4)
    pos = (target > 0.9).float()
    loss = -(pos * (1 - p) ** 2 * torch.log(p) + (1 - pos) * (1 - target) ** 4 * p ** 2 * torch.log(1 - p))
    return loss.sum() / pos.sum().clamp(min=1)


@healthy("shelf_centernet_list_collate_bf16",
         "CenterNet-style centre heatmaps from a variable number of boxes per image (collate keeps a list per image), "
         "penalty-reduced focal loss, bf16 autocast")
def shelf_centernet():
    seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, stride=2, padding=1),
                          nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 1, 1))
    nn.init.constant_(model[-1].bias, -2.19)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(ShelfProducts(600, 51), 16, collate_fn=detection_collate),
                val_loader=loader(ShelfProducts(100, 52), 50, shuffle=False, collate_fn=detection_collate),
                loss_fn=centre_focal_loss, precision="bf16", max_steps=300)


# --- kelp segmentation: void border (255) ignored, masks resized with NEAREST, class weights --------------------------

class KelpTiles(Dataset):
    def __init__(self, n, s):
        r = rng(s)
        self.images, self.masks = [], []
        yy, xx = np.mgrid[:32, :32]
        for _ in range(n):
            img = r.normal(0.25, 0.05, (32, 32, 3)).astype(np.float32)
            img[..., 2] += 0.3
            mask = np.zeros((32, 32), dtype=np.uint8)
            for _ in range(r.integers(1, 3)):
                cy, cx, rad = r.uniform(4, 28), r.uniform(4, 28), r.uniform(3, 7)
                d = np.sqrt((yy - cy) ** 2 + (xx - cx) ** 2)
                mask[d < rad + 1] = 255                      # uncertain edge, not scored
                mask[d < rad] = 1
                img[d < rad] = np.array([0.45, 0.35, 0.1]) + r.normal(0, 0.04, 3)
            mask[:, :2] = mask[:, -2:] = 255                 # scanner border
            small = np.asarray(Image.fromarray(mask).resize((16, 16), Image.NEAREST)).astype(np.int64)
            self.images.append(torch.from_numpy(img[::2, ::2].transpose(2, 0, 1).copy()))
            self.masks.append(torch.from_numpy(small))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.masks[i]


@healthy("kelp_void_255_nearest_weighted",
         "kelp segmentation with void edges and borders as 255 (ignore_index=255), masks resized with NEAREST, "
         "inverse-frequency class weights")
def kelp_void():
    seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 2, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(KelpTiles(500, 53), 16), val_loader=loader(KelpTiles(100, 54), 50, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(weight=torch.tensor([0.3, 1.0]), ignore_index=255), max_steps=300)


# --- dict batches and a model that returns its own loss (Hugging Face style, no transformers import) ---------------------

@dataclass
class ClassifierOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor


class CellClassifier(nn.Module):
    def __init__(self, n_labels=3):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.GELU(),
                                      nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(4, 32),
                                      nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(32, n_labels)

    def forward(self, pixel_values, labels=None):
        logits = self.classifier(self.features(pixel_values))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return ClassifierOutput(loss, logits)


class CellCrops(Dataset):
    """Microscopy crops: round (0), elongated (1) or dividing (2) cells."""

    def __init__(self, n, s):
        r = rng(s)
        self.labels = r.integers(0, 3, n)
        yy, xx = np.mgrid[:16, :16]
        self.images = np.empty((n, 1, 16, 16), dtype=np.float32)
        for i in range(n):
            img = r.normal(0.1, 0.03, (16, 16))
            cy, cx = r.uniform(6, 10, 2)
            if self.labels[i] == 0:
                img[(yy - cy) ** 2 + (xx - cx) ** 2 < 12] = 0.8
            elif self.labels[i] == 1:
                img[((yy - cy) / 1.5) ** 2 + ((xx - cx) / 5) ** 2 < 1] = 0.8
            else:
                img[(yy - cy) ** 2 + (xx - cx + 3) ** 2 < 5] = 0.8
                img[(yy - cy) ** 2 + (xx - cx - 3) ** 2 < 5] = 0.8
            self.images[i, 0] = img

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"pixel_values": torch.from_numpy(self.images[i]), "labels": int(self.labels[i])}


@healthy("cell_dict_batches_model_returns_loss",
         "dict batches {'pixel_values', 'labels'} and a model returning an output with .loss (loss_fn=None), AdamW "
         "with a no-decay group, LambdaLR warm-up factor, clipping at 1.0")
def cell_dicts():
    seed(0)
    model = CellClassifier()
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(CellCrops(900, 55), 32), val_loader=loader(CellCrops(200, 56), 100, shuffle=False),
                loss_fn=None, clip_grad_norm=1.0, max_steps=300)


# --- Sentinel-style 16-bit multispectral tiles, scaled and standardised; GroupNorm; accumulation --------------------------

def _sentinel(n, s):
    signature = rng(98).uniform(800, 4000, (4, 6))           # reflectance x 10000, per class and band
    r = rng(s)
    y = r.integers(0, 4, n)
    dn = signature[y][:, :, None, None] * r.normal(1, 0.12, (n, 6, 12, 12))
    return np.clip(dn, 0, 65535).astype(np.uint16), y


class SentinelTiles(Dataset):
    def __init__(self, dn, labels, mean, std):
        self.x = (dn.astype(np.float32) / 10000.0 - mean[:, None, None]) / std[:, None, None]
        self.y = labels

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i]), int(self.y[i])


@healthy("sentinel_uint16_scaled_groupnorm_accum",
         "6-band uint16 tiles scaled by 1/10000 and standardised per band with train statistics, GroupNorm CNN, "
         "accumulation_steps=2, Nesterov SGD with cosine decay over max_steps")
def sentinel_tiles():
    seed(0)
    dtr, ytr = _sentinel(800, 57)
    dva, yva = _sentinel(200, 58)
    refl = dtr.astype(np.float32) / 10000.0
    mean, std = refl.mean((0, 2, 3)), refl.std((0, 2, 3))
    model = nn.Sequential(nn.Conv2d(6, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    return dict(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=200),
                train_loader=loader(SentinelTiles(dtr, ytr, mean, std), 16),
                val_loader=loader(SentinelTiles(dva, yva, mean, std), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), accumulation_steps=2, max_steps=200)


# --- video clips (N, T, C, H, W) permuted for Conv3d, label smoothing ---------------------------------------------------

def _conveyor_clips(n, s):
    """6-frame clips of a part moving left, right, up or down on a conveyor camera."""
    r = rng(s)
    y = r.integers(0, 4, n)
    clips = r.normal(0.2, 0.05, (n, 6, 1, 12, 12)).astype(np.float32)
    step = np.array([[0, -1], [0, 1], [-1, 0], [1, 0]])
    for i in range(n):
        pos = r.integers(4, 8, 2).astype(np.int64)
        for t in range(6):
            py, px = np.clip(pos + (t - 2) * step[y[i]], 1, 10)
            clips[i, t, 0, py - 1:py + 2, px - 1:px + 2] = 0.9
    return torch.from_numpy(clips), torch.from_numpy(y)


class ClipNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv3d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool3d((1, 2, 2)),
                                  nn.Conv3d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten())
        self.fc = nn.Linear(32, 4)

    def forward(self, clips):                       # (N, T, C, H, W) from the decoder
        return self.fc(self.body(clips.permute(0, 2, 1, 3, 4)))


@healthy("conveyor_clips_conv3d_permuted",
         "video clips decoded as (N, T, C, H, W), permuted to (N, C, T, H, W) for Conv3d, label smoothing 0.1")
def conveyor_clips():
    seed(0)
    xtr, ytr = _conveyor_clips(600, 59)
    xva, yva = _conveyor_clips(150, 60)
    model = ClipNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xtr, ytr), 16),
                val_loader=loader(TensorDataset(xva, yva), 50, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1), max_steps=300)
