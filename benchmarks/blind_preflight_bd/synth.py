"""Synthetic, seeded data for set bd (nothing downloaded): shape images with masks, single-box images, two-point
"keypoint" images, blob images for CenterNet heatmaps, and Weibull survival tables with censoring."""

from __future__ import annotations

import math

import numpy as np
import torch

IGNORE = 255


def _rng(s):
    return np.random.default_rng(s)


def seg_shapes(n, size=32, s=0, ignore_border=False, hw_last=False):
    """Images (n, 3, H, W) float32 and masks (n, H, W) int64: 0 background, 1 square, 2 disc. The square is brighter
    in channel 0, the disc in channel 1, both on noise. ``ignore_border``: a 2-pixel frame of 255 in the mask."""
    r = _rng(s)
    imgs = r.normal(0, 0.3, (n, 3, size, size)).astype(np.float32)
    masks = np.zeros((n, size, size), np.int64)
    yy, xx = np.mgrid[:size, :size]
    for i in range(n):
        a = r.integers(4, size // 3)
        y0, x0 = r.integers(0, size - a, 2)
        masks[i, y0:y0 + a, x0:x0 + a] = 1
        rad = r.uniform(3, size / 6)
        cy, cx = r.uniform(rad, size - rad, 2)
        disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= rad ** 2
        masks[i][disc] = 2
    imgs[:, 0] += 1.2 * (masks == 1) + 0.5 * (masks == 2)
    imgs[:, 1] += 1.2 * (masks == 2) + 0.5 * (masks == 1)
    imgs[:, 2] += 0.6 * (masks > 0)
    if ignore_border:
        masks[:, :2, :] = IGNORE
        masks[:, -2:, :] = IGNORE
        masks[:, :, :2] = IGNORE
        masks[:, :, -2:] = IGNORE
    if hw_last:  # numpy HWC images as read from disk
        imgs = imgs.transpose(0, 2, 3, 1).copy()
    return imgs, masks


def box_images(n, size=32, s=0):
    """One bright rectangle per 1-channel image: images (n, 1, H, W) float32, boxes (n, 4) xyxy in pixels."""
    r = _rng(s)
    imgs = r.normal(0, 0.25, (n, 1, size, size)).astype(np.float32)
    boxes = np.zeros((n, 4), np.float32)
    for i in range(n):
        w, h = r.integers(6, size // 2, 2)
        x0 = r.integers(0, size - w)
        y0 = r.integers(0, size - h)
        imgs[i, 0, y0:y0 + h, x0:x0 + w] += 1.5
        boxes[i] = (x0, y0, x0 + w, y0 + h)
    return imgs, boxes


def two_points(n, size=32, s=0):
    """Two identical blobs per image (a 'left' and a 'right' landmark, left = smaller x): images (n, 1, H, W),
    keypoints (n, 2, 2) as (x, y) in pixels, [0] the left one."""
    r = _rng(s)
    yy, xx = np.mgrid[:size, :size]
    imgs = r.normal(0, 0.2, (n, 1, size, size)).astype(np.float32)
    kps = np.zeros((n, 2, 2), np.float32)
    for i in range(n):
        xl = r.uniform(3, size / 2 - 3)
        xr = r.uniform(size / 2 + 3, size - 3)
        yl, yr = r.uniform(3, size - 3, 2)
        for j, (x, y) in enumerate(((xl, yl), (xr, yr))):
            imgs[i, 0] += 1.5 * np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / (2 * 1.5 ** 2))
            kps[i, j] = (x, y)
    return imgs, kps


def blob_centers(n, size=32, s=0):
    """One disc per 1-channel image: images (n, 1, H, W), centres (n, 2) as (x, y) in pixels (integers + 0.5 offsets
    are not guaranteed: sub-pixel centres)."""
    r = _rng(s)
    yy, xx = np.mgrid[:size, :size]
    imgs = r.normal(0, 0.25, (n, 1, size, size)).astype(np.float32)
    ctr = np.zeros((n, 2), np.float32)
    for i in range(n):
        rad = r.uniform(2.5, 5)
        cx, cy = r.uniform(rad, size - rad, 2)
        imgs[i, 0] += 1.5 * (((xx - cx) ** 2 + (yy - cy) ** 2) <= rad ** 2)
        ctr[i] = (cx, cy)
    return imgs, ctr


def gaussian_heatmap(centers, out_size, stride, sigma=1.0, exact_peak=True):
    """CenterNet targets: (n, out_size, out_size) with a Gaussian at centre / stride. ``exact_peak``: centred on the
    integer cell so the peak is exactly 1 (as CenterNet renders it)."""
    n = centers.shape[0]
    yy, xx = np.mgrid[:out_size, :out_size]
    hm = np.zeros((n, out_size, out_size), np.float32)
    for i in range(n):
        cx, cy = centers[i] / stride
        if exact_peak:
            cx, cy = min(int(cx), out_size - 1), min(int(cy), out_size - 1)
        hm[i] = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * sigma ** 2))
    return hm


def survival_table(n, d=8, s=0, censor_rate=0.5, censor_feature=None, shape=1.5):
    """Weibull proportional-hazards times: features (n, d) float32, observed time (n,), event (n,) 1 = died,
    and the true event time (n,) (for a C-index on uncensored truth). Censoring is independent exponential."""
    r = _rng(s)
    x = r.normal(size=(n, d)).astype(np.float32)
    beta = np.array([1.0, -0.8, 0.6, 0.0, 0.5, 0.0, -0.4, 0.0][:d] + [0.0] * max(0, d - 8), np.float32)
    risk = x @ beta + 0.5 * np.tanh(x[:, 0] * x[:, 1])
    k, lam = shape, 10.0
    u = r.uniform(size=n)
    t_true = lam * (-np.log(u) / np.exp(risk)) ** (1 / k)
    c = r.exponential(np.median(t_true) / censor_rate * 0.6, size=n)
    if censor_feature is not None:  # follow-up depends on a covariate (e.g. the enrolment site): censoring is
        c = c * np.exp(-1.5 * x[:, censor_feature])  # independent of the event time given the features
    t = np.minimum(t_true, c).astype(np.float32)
    e = (t_true <= c).astype(np.float32)
    return x, t, e, t_true.astype(np.float32)


def discretize(t, edges):
    """Interval index of each time for a discrete-time hazard model (edges: inner cut points)."""
    return np.clip(np.searchsorted(edges, t, side="right"), 0, len(edges))


def concordance(risk, time, event=None):
    """Harrell's C: fraction of comparable pairs (i had an event before j's time) where risk_i > risk_j."""
    risk, time = torch.as_tensor(risk).float().reshape(-1), torch.as_tensor(time).float().reshape(-1)
    event = torch.ones_like(time) if event is None else torch.as_tensor(event).float().reshape(-1)
    comparable = (time[:, None] < time[None, :]) & (event[:, None] > 0)
    right = (risk[:, None] > risk[None, :]).float() + 0.5 * (risk[:, None] == risk[None, :]).float()
    return float((right * comparable).sum() / comparable.sum().clamp(min=1))


def miou(pred, mask, n_classes):
    keep = mask != IGNORE
    ious = []
    for c in range(n_classes):
        p, t = (pred == c) & keep, (mask == c) & keep
        union = (p | t).sum().item()
        if union:
            ious.append((p & t).sum().item() / union)
    return sum(ious) / max(len(ious), 1)


def box_iou_xyxy(a, b):
    x0 = torch.maximum(a[:, 0], b[:, 0])
    y0 = torch.maximum(a[:, 1], b[:, 1])
    x1 = torch.minimum(a[:, 2], b[:, 2])
    y1 = torch.minimum(a[:, 3], b[:, 3])
    inter = (x1 - x0).clamp(min=0) * (y1 - y0).clamp(min=0)
    area = lambda z: (z[:, 2] - z[:, 0]).clamp(min=0) * (z[:, 3] - z[:, 1]).clamp(min=0)  # noqa: E731
    return inter / (area(a) + area(b) - inter).clamp(min=1e-6)


def t(a, dtype=None):
    out = torch.from_numpy(np.ascontiguousarray(a))
    return out if dtype is None else out.to(dtype)


__all__ = ["IGNORE", "seg_shapes", "box_images", "two_points", "blob_centers", "gaussian_heatmap", "survival_table",
           "discretize", "concordance", "miou", "box_iou_xyxy", "t", "math"]
