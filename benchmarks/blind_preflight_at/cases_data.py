"""Data: point-cloud normalisation, image-caption augmentation and vocabulary, video frame sampling."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from benchmarks.blind_preflight_at.registry import (  # noqa: F401
    CaptionSet,
    DualEncoder,
    Pairs,
    PointNet,
    Video3D,
    acc_of,
    build_vocab,
    caption_loaders,
    case,
    clip_loss,
    fix,
    fixed_of,
    gen,
    image_captions,
    loader,
    moving_blobs,
    pad_collate,
    point_clouds,
    retrieval_acc,
    rmse_of,
    seed,
)

ACC = acc_of(lambda m, b: (m(b[0]).argmax(1), b[1]))


class ScanSet(Dataset):
    """Scans of objects; the target is the object's size in metres. Each cloud is centred (and, in the broken
    version, scaled into the unit sphere, the usual ModelNet preprocessing)."""

    def __init__(self, n, s, unit_sphere):
        self.pts, _, self.size = point_clouds(n, s=s, offset=3.0, size_range=(0.5, 2.5))
        self.unit_sphere = unit_sphere

    def __len__(self):
        return len(self.pts)

    def __getitem__(self, i):
        p = self.pts[i] - self.pts[i].mean(0)
        if self.unit_sphere:
            p = p / p.norm(dim=1).max()
        return p, self.size[i]


class SizeNet(PointNet):
    def __init__(self):
        super().__init__(out=1)

    def forward(self, pts):
        return super().forward(pts).squeeze(-1)


@case("pc_unit_sphere_removes_size", "data",
      "The point-cloud Dataset scales every cloud into the unit sphere (p / p.norm(dim=1).max()), the usual "
      "classification preprocessing, while the target is the object's physical size, so the per-cloud scaling "
      "removes exactly the quantity being regressed.",
      r"unit sphere|(per-cloud|each cloud|per-sample).{0,40}(scal|normali[sz])|(scal|normali[sz]).{0,80}"
      r"(remov|destroy|erase|discard).{0,40}(size|scale|target)|(size|scale).{0,60}(no longer|not) "
      r"(recoverable|available|present)|norm\(dim ?= ?1\)\.max")
def pc_unit_sphere_removes_size(fixed=False):
    seed(0)
    tr = loader(ScanSet(1024, 41, not fixed), 32)
    va = loader(ScanSet(256, 42, not fixed), 128, shuffle=False)
    model = SizeNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.MSELoss(), max_steps=200)


fix("pc_unit_sphere_removes_size", fixed_of(pc_unit_sphere_removes_size), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE (size)", higher=False)


@case("clip_hflip_breaks_captions", "data",
      "The image-caption Dataset applies a random horizontal flip (p=0.5) to the images while the captions say "
      "'left' or 'right', so half the training pairs describe the mirrored position and the dual encoder cannot "
      "learn left from right.",
      r"flip|mirror|(augment).{0,80}(caption|text|left|right)|(left|right).{0,60}(caption|swap|wrong|contradict)")
def clip_hflip_breaks_captions(fixed=False):
    seed(0)
    tr, va, vocab = caption_loaders(flip_p=0.0 if fixed else 0.5)
    model = DualEncoder(len(vocab) + 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=clip_loss, max_steps=200)


fix("clip_hflip_breaks_captions", fixed_of(clip_hflip_breaks_captions), retrieval_acc,
    "val image->text retrieval accuracy")


@case("caption_vocab_rebuilt_for_val", "data",
      "The caption tokeniser's vocabulary (word -> id in order of first appearance) is built separately from the "
      "validation captions, so the same word gets a different id in validation than in training and the text "
      "encoder reads other words at evaluation.",
      r"vocab|(token|word) ids?.{0,60}(differ|mismatch|inconsistent)|tokeni[sz]er.{0,60}(separate|rebuilt|refit|"
      r"different|fit on)|(fit|built|rebuilt).{0,40}(on|from) (the )?val")
def caption_vocab_rebuilt_for_val(fixed=False):
    seed(0)
    img, caps, combo = image_captions(1280, s=5)
    vocab = build_vocab(caps[:1024])
    tr = CaptionSet(img[:1024], caps[:1024], combo[:1024], vocab)
    va = CaptionSet(img[1024:], caps[1024:], combo[1024:], vocab if fixed else build_vocab(caps[1024:]))
    model = DualEncoder(len(vocab) + 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3),
                train_loader=loader(tr, 32, collate_fn=pad_collate, drop_last=True),
                val_loader=loader(va, 64, shuffle=False, collate_fn=pad_collate), loss_fn=clip_loss, max_steps=200)


fix("caption_vocab_rebuilt_for_val", fixed_of(caption_vocab_rebuilt_for_val), retrieval_acc,
    "val image->text retrieval accuracy")


class FrameSampler(Dataset):
    """Videos of 12 frames; each item samples 6 of them."""

    def __init__(self, n, s, sort):
        vid, self.y, _ = moving_blobs(n, frames=12, s=s)
        self.vid = vid.permute(0, 4, 1, 2, 3).contiguous()  # (V, C, T, H, W)
        self.sort, self.g = sort, gen(s + 7)

    def __len__(self):
        return len(self.vid)

    def __getitem__(self, i):
        idx = torch.randperm(12, generator=self.g)[:6]   # like random.sample(range(12), 6)
        if self.sort:
            idx = idx.sort().values
        return self.vid[i][:, idx], self.y[i]


@case("video_frames_sampled_unsorted", "data",
      "The video Dataset picks 6 of 12 frames with a random sample of frame indices and never sorts them, so the "
      "frames of each clip are in random temporal order and the direction of motion (the label) is lost.",
      r"sort|(temporal|frame|time) order|(order|shuffl|random).{0,60}frames|frames?.{0,60}(shuffl|out of order|"
      r"unordered|random order)|random\.sample|randperm")
def video_frames_sampled_unsorted(fixed=False):
    seed(0)
    tr = loader(FrameSampler(768, 51, fixed), 32)
    va = loader(FrameSampler(256, 52, True), 128, shuffle=False)
    model = Video3D()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("video_frames_sampled_unsorted", fixed_of(video_frames_sampled_unsorted), ACC, "val accuracy")


def minmax_per_axis(pts):
    lo, hi = pts.min(1, keepdim=True).values, pts.max(1, keepdim=True).values
    return (pts - lo) / (hi - lo)


def centre_unit_sphere(pts):
    p = pts - pts.mean(1, keepdim=True)
    return p / p.norm(dim=2).max(1).values[:, None, None]


@case("pc_minmax_per_axis", "data",
      "Point clouds are normalised with a per-axis min-max scaling ((p - p.min(0)) / (p.max(0) - p.min(0)) per "
      "coordinate), which stretches every cloud to a unit cube and destroys its aspect ratio, the very thing that "
      "tells rods, disks and blobs apart.",
      r"per[- ]axis|(each|every|per) (axis|coordinate|dimension).{0,60}(separately|independent|min|max|scal)|"
      r"min-?max|aspect ratio|(anisotropic|non-uniform) scal|unit cube|isotropic")
def pc_minmax_per_axis(fixed=False):
    seed(0)
    pts, y, _ = point_clouds(1536, s=1)
    pts = centre_unit_sphere(pts) if fixed else minmax_per_axis(pts)
    tr, va = loader(Pairs(pts[:1024], y[:1024]), 32), loader(Pairs(pts[1024:], y[1024:]), 128, shuffle=False)
    model = PointNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 1e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("pc_minmax_per_axis", fixed_of(pc_minmax_per_axis), ACC, "val accuracy")
