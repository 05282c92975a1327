"""Set aa's case registry: set a's Case / CaseTable and data helpers, its own case table, the synthetic vision /
audio / sensor data its cases share, and the one-line fixes ``verify.py`` trains next to each broken case (``FIXES``:
no preflight involved)."""

from __future__ import annotations

import math

import torch

from benchmarks.blind_preflight.fixes import FixTable, accuracy, val_acc  # noqa: F401
from benchmarks.blind_preflight.registry import (  # noqa: F401
    Case,
    CaseTable,
    gen,
    loader,
    mean_over,
    model_device,
    seed,
    twin,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_aa")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


# ----------------------------------------------------------------------------------------------- metrics

def acc_of(fwd):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels) of any matching shape."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1), y.reshape(-1)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def rmse_of(fwd):
    """Validation RMSE with fwd(model, batch) -> (predictions, targets) of any matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


def mae_of(fwd):
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return (p - y).abs().sum().item(), y.numel()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def balanced_pixel_acc_of(fwd, classes: int):
    """Mean over classes of the per-class pixel recall on the validation set (chance-free: all background = 1/C)."""
    @torch.no_grad()
    def metric(model, kw):
        was = model.training
        model.eval()
        hit = torch.zeros(classes)
        tot = torch.zeros(classes)
        for b in kw["val_loader"]:
            p, y = fwd(model, b)
            p, y = p.reshape(-1).cpu(), y.reshape(-1).cpu()
            for c in range(classes):
                sel = y == c
                tot[c] += sel.sum()
                hit[c] += (p[sel] == c).sum()
        model.train(was)
        return (hit / tot.clamp(min=1)).mean().item()
    return metric


def fg_iou_of(fwd):
    """Foreground IoU over the whole validation set, fwd(model, batch) -> (bool predicted mask, bool true mask)."""
    @torch.no_grad()
    def metric(model, kw):
        was = model.training
        model.eval()
        inter = union = 0.0
        for b in kw["val_loader"]:
            p, y = fwd(model, b)
            p, y = p.bool().cpu(), y.bool().cpu()
            inter += (p & y).sum().item()
            union += (p | y).sum().item()
        model.train(was)
        return inter / max(union, 1.0)
    return metric


# ----------------------------------------------------------------------------------------------- shared data

def rect_scenes(n: int, size: int = 16, classes: int = 3, s: int = 0, noise: float = 0.8):
    """Images (n, 3, size, size) with one or two axis-aligned rectangles per foreground class; class c brightens
    channel c - 1 inside its rectangles. Masks (n, size, size) int64 in 0..classes-1 (0: background)."""
    g = gen(s)
    masks = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        for c in range(1, classes):
            for _ in range(int(torch.randint(1, 3, (1,), generator=g))):
                h, w = torch.randint(3, size // 2 + 1, (2,), generator=g).tolist()
                top = int(torch.randint(0, size - h + 1, (1,), generator=g))
                left = int(torch.randint(0, size - w + 1, (1,), generator=g))
                masks[i, top:top + h, left:left + w] = c
    img = noise * torch.randn(n, 3, size, size, generator=g)
    for c in range(1, classes):
        img[:, c - 1] += 1.5 * (masks == c).float()
    return img, masks


def blob_scenes(n: int, size: int = 16, s: int = 0, noise: float = 0.6):
    """Single-channel images with one or two irregular blobs (unions of discs), binary masks (n, size, size) in {0, 1}.
    The blobs are asymmetric, so a flipped mask no longer lies on its image."""
    g = gen(s)
    yy, xx = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    masks = torch.zeros(n, size, size)
    for i in range(n):
        for _ in range(int(torch.randint(1, 3, (1,), generator=g))):
            cy, cx = (torch.rand(2, generator=g) * (size - 6) + 3).tolist()
            for _ in range(3):
                dy, dx = (torch.randn(2, generator=g) * 1.5).tolist()
                r = float(torch.rand(1, generator=g)) * 1.5 + 1.5
                masks[i] = torch.maximum(masks[i], (((yy - cy - dy) ** 2 + (xx - cx - dx) ** 2) <= r * r).float())
    img = noise * torch.randn(n, 1, size, size, generator=g) + 1.2 * masks[:, None]
    return img, masks


def tone_clips(n: int, length: int = 128, s: int = 0, classes: int = 4, noise: float = 0.8):
    """Sensor / audio clips (n, 1, length): class k is a burst of a sine of frequency (k + 1) / 16 cycles per sample
    at a random position, in noise."""
    g = gen(s)
    y = torch.randint(0, classes, (n,), generator=g)
    t = torch.arange(length).float()
    x = noise * torch.randn(n, 1, length, generator=g)
    for i in range(n):
        start = int(torch.randint(0, length // 2, (1,), generator=g))
        burst = torch.zeros(length)
        burst[start:start + length // 2] = 1.0
        phase = float(torch.rand(1, generator=g)) * 6.28
        x[i, 0] += 1.5 * burst * torch.sin(2 * math.pi * (int(y[i]) + 1) / 16 * t + phase)
    return x, y
