"""Shapes: point-cloud, video and per-frame layouts."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_at.registry import (  # noqa: F401
    DIRS,
    FrameTagger,
    Pairs,
    PointNet,
    Video3D,
    acc_of,
    case,
    fix,
    fixed_of,
    frame_sequences,
    loader,
    moving_blobs,
    point_clouds,
    seed,
)


def _pc_loaders(offset=0.0, n=1024, nv=512):
    pts, y, _ = point_clouds(n + nv, s=1, offset=offset)
    return loader(Pairs(pts[:n], y[:n]), 32), loader(Pairs(pts[n:], y[n:]), 128, shuffle=False)


class PointNetView(PointNet):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed

    def forward(self, pts):  # (B, N, 3) from the loader
        B, N, _ = pts.shape
        x = pts.transpose(1, 2) if self.fixed else pts.view(B, 3, N)  # Conv1d wants (B, 3, N)
        return self.head(self.feat(x).max(dim=2).values)


@case("pc_view_not_transpose", "shapes",
      "The PointNet turns the loader's (B, N, 3) point clouds into Conv1d's (B, 3, N) with pts.view(B, 3, N) instead "
      "of pts.transpose(1, 2), so each 'xyz' column mixes coordinates of different points and the axes are scrambled.",
      r"view\(B, ?3, ?N\)|(view|reshape).{0,40}(instead of|not|rather than).{0,20}(transpose|permute)|(transpose|permute)\(?.{0,30}"
      r"(1, ?2|2, ?1|0, ?2, ?1)|scrambl.{0,40}(coordinat|point|xyz|axes)|(B, ?N, ?3).{0,60}(B, ?3, ?N)|"
      r"(points|coordinates|xyz).{0,60}(mix|interleav|scrambl)")
def pc_view_not_transpose(fixed=False):
    seed(0)
    tr, va = _pc_loaders()
    model = PointNetView(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 1e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("pc_view_not_transpose", fixed_of(pc_view_not_transpose), acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])),
    "val accuracy")


class PointNetPoolDim(PointNet):
    def __init__(self, n_points=64, fixed=False):
        super().__init__()
        self.fixed = fixed
        if not fixed:  # the head was resized to make the shapes fit: Linear(n_points, ...)
            self.head = nn.Sequential(nn.Linear(n_points, 64), nn.ReLU(), nn.Linear(64, 5))

    def forward(self, pts):
        x = self.feat(pts.transpose(1, 2))  # (B, 64, N)
        pooled = x.max(dim=2).values if self.fixed else x.max(dim=1).values
        return self.head(pooled)


@case("pc_maxpool_over_channels", "shapes",
      "The PointNet's symmetric max pool runs over the feature dimension (x.max(dim=1) on (B, C, N)) instead of over "
      "the points (dim=2), and the head was resized to Linear(N, ...), so the model depends on the arbitrary point "
      "order and is no longer permutation invariant.",
      r"max\(dim ?= ?1\)|max.{0,40}(over|along|across).{0,30}(channel|feature)|permutation[- ]invarian|"
      r"(pool|max|reduc).{0,60}(point dimension|points? (axis|dim)|dim ?= ?2|over (the )?points)|"
      r"point order|order of (the )?points|Linear\(N|number of points.{0,40}(head|linear|in_features)")
def pc_maxpool_over_channels(fixed=False):
    seed(0)
    tr, va = _pc_loaders()
    model = PointNetPoolDim(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 1e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("pc_maxpool_over_channels", fixed_of(pc_maxpool_over_channels),
    acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])), "val accuracy")


class CentredPointNet(PointNet):
    def __init__(self, fixed=False):
        super().__init__()
        self.dim = 1 if fixed else 0

    def forward(self, pts):  # (B, N, 3): centre each cloud on its centroid first
        pts = pts - pts.mean(dim=self.dim, keepdim=True)
        return super().forward(pts)


@case("pc_centre_wrong_dim", "shapes",
      "The per-cloud centring pts - pts.mean(dim=0, keepdim=True) averages over the batch dimension of (B, N, 3) "
      "instead of over the points (dim=1), so each cloud keeps its large random translation and the classifier sees "
      "positions instead of shapes.",
      r"mean\(dim ?= ?0|(centr|center|centroid).{0,80}(batch dim|dim ?= ?0|axis ?= ?0|across (the )?(batch|clouds))|"
      r"(batch dim|dim ?= ?0|axis ?= ?0|across (the )?(batch|clouds)).{0,80}(centr|center|centroid|translation)|"
      r"(translation|offset).{0,60}(not removed|remain|kept|still)")
def pc_centre_wrong_dim(fixed=False):
    seed(0)
    tr, va = _pc_loaders(offset=6.0)
    model = CentredPointNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 1e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("pc_centre_wrong_dim", fixed_of(pc_centre_wrong_dim), acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])),
    "val accuracy")


class FramewiseVideoNet(nn.Module):
    """A 2-D CNN applied to every frame (frames folded into the batch), frame features averaged per clip."""

    def __init__(self, fixed=False, n_classes=3):
        super().__init__()
        self.fixed = fixed
        self.cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten())
        self.head = nn.Linear(16, n_classes)

    def forward(self, clip):  # (B, T, C, H, W)
        B, T = clip.shape[:2]
        f = self.cnn(clip.reshape(B * T, *clip.shape[2:]))  # (B*T, D), rows ordered video-major
        f = f.view(B, T, -1).mean(1) if self.fixed else f.view(T, B, -1).mean(0)
        return self.head(f)


def _video_loaders(n=768, nv=256):
    vid, _, colour = moving_blobs(n + nv, frames=6, s=2)
    vid = vid.permute(0, 1, 4, 2, 3).contiguous()  # (B, T, C, H, W)
    return loader(Pairs(vid[:n], colour[:n]), 32), loader(Pairs(vid[n:], colour[n:]), 128, shuffle=False)


@case("video_unfold_frames_wrong_order", "shapes",
      "Frames are folded into the batch as clip.reshape(B * T, C, H, W) (video-major rows) but the per-frame "
      "features are unfolded with f.view(T, B, -1).mean(0) instead of f.view(B, T, -1).mean(1), so each clip's "
      "pooled feature averages frames of other videos in the batch.",
      r"view\(T, ?B|view\(B, ?T|(B ?\* ?T|B\*T|batch ?\* ?time).{0,80}(order|unfold|view|reshape)|"
      r"frames? (of|from) (other|different) (videos|clips)|mix.{0,40}(frames|clips|videos)|"
      r"(time|frame|temporal).{0,40}(and|with).{0,20}batch.{0,40}(swap|order|mix|confus)")
def video_unfold_frames_wrong_order(fixed=False):
    seed(0)
    tr, va = _video_loaders()
    model = FramewiseVideoNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("video_unfold_frames_wrong_order", fixed_of(video_unfold_frames_wrong_order),
    acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])), "val accuracy")


def _frame_loaders(n=512, nv=128, length=32):
    x, y = frame_sequences(n + nv, length=length, s=4)
    return loader(Pairs(x[:n], y[:n]), 32), loader(Pairs(x[n:], y[n:]), 128, shuffle=False)


def frame_loss_of(fixed):
    def loss_fn(model, batch):
        x, y = batch
        logits = model(x)  # (B, C, T)
        C = logits.shape[1]
        flat = logits.permute(0, 2, 1).reshape(-1, C) if fixed else logits.reshape(-1, C)
        return nn.functional.cross_entropy(flat, y.reshape(-1))
    return loss_fn


@case("frame_logits_flatten_scramble", "shapes",
      "Per-frame logits come out of the Conv1d tagger as (B, C, T) and the loss flattens them with "
      "logits.reshape(-1, C) without first permuting to (B, T, C), so the rows paired with y.reshape(-1) mix "
      "classes and frames and no row belongs to its label's frame.",
      r"reshape\(-1, ?C\)|view\(-1, ?C\)|(B, ?C, ?T).{0,80}(B, ?T, ?C|permute|transpose)|"
      r"permute\(0, ?2, ?1\)|(flatten|reshape|view).{0,80}(without|before|instead of).{0,40}(permut|transpos)|"
      r"class(es)? (dim|axis).{0,60}(not last|second|dim ?= ?1)")
def frame_logits_flatten_scramble(fixed=False):
    seed(0)
    tr, va = _frame_loaders()
    model = FrameTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tr, val_loader=va,
                loss_fn=frame_loss_of(fixed), max_steps=200)


fix("frame_logits_flatten_scramble", fixed_of(frame_logits_flatten_scramble),
    acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])), "val per-frame accuracy")
