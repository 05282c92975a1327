"""Targets: contrastive labels, per-point and per-frame labels, clip labels."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from benchmarks.blind_preflight_at.registry import (  # noqa: F401
    DualEncoder,
    FrameTagger,
    Pairs,
    Video3D,
    acc_of,
    caption_loaders,
    case,
    clip_loss,
    fix,
    fixed_of,
    frame_sequences,
    gen,
    loader,
    moving_blobs,
    point_clouds,
    retrieval_acc,
    seed,
)


def clip_loss_zeros(model, batch):
    img, tokens, lengths, _ = batch
    logits = model(img, tokens, lengths)
    labels = torch.zeros(len(img), dtype=torch.long, device=logits.device)  # "the matching pair is the target"
    return (nn.functional.cross_entropy(logits, labels) + nn.functional.cross_entropy(logits.T, labels)) / 2


@case("clip_labels_all_zero", "targets",
      "The CLIP-style contrastive loss uses torch.zeros(B) as the targets of the (B, B) image-text logits instead of "
      "torch.arange(B), so every image is trained to match the first caption of the batch and the diagonal "
      "(the true pairs) is never the target.",
      r"arange|zeros\(|diagonal|(target|label)s?.{0,60}(all (zero|0)|always (0|zero)|first (caption|text|column))|"
      r"(i-th|ith|matching|paired|true pair).{0,60}(caption|text|target|index)")
def clip_labels_all_zero(fixed=False):
    seed(0)
    tr, va, vocab = caption_loaders()
    model = DualEncoder(len(vocab) + 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=clip_loss if fixed else clip_loss_zeros, max_steps=200)


fix("clip_labels_all_zero", fixed_of(clip_labels_all_zero), retrieval_acc, "val image->text retrieval accuracy")


class SortedCollate:
    """Sorts the captions by length (longest first) for pack_padded_sequence(enforce_sorted=True)."""

    def __init__(self, fixed):
        self.fixed = fixed

    def __call__(self, batch):
        imgs, ids, combo = zip(*batch)
        lengths = torch.tensor([len(t) for t in ids])
        order = torch.argsort(lengths, descending=True, stable=True)
        tokens = nn.utils.rnn.pad_sequence([ids[i] for i in order], batch_first=True)
        imgs = torch.stack(imgs)
        combo = torch.stack(list(combo))
        if self.fixed:
            imgs, combo = imgs[order], combo[order]
        return imgs, tokens, lengths[order], combo


class SortedDual(DualEncoder):
    def forward(self, img, tokens, lengths):
        return self.logit_scale.exp().clamp(max=100) * self.encode_image(img) @ \
            self.encode_text(tokens, lengths, sorted_=True).T


@case("clip_collate_sorts_captions", "targets",
      "The collate function sorts the captions by length for pack_padded_sequence(enforce_sorted=True) but leaves "
      "the images in their original order, so the arange(B) contrastive targets pair each image with some other "
      "caption: the diagonal is no longer the true pair.",
      r"sort.{0,80}(caption|text|token|length)|(caption|text|token|length).{0,80}sort|enforce_sorted|"
      r"(image|img)s?.{0,60}(not|never).{0,30}(reorder|sorted|permut)|(reorder|permut).{0,60}(image|img)|"
      r"pairs?.{0,40}(misalign|broken|shuffl)")
def clip_collate_sorts_captions(fixed=False):
    seed(0)
    tr, va, vocab = caption_loaders()
    collate = SortedCollate(fixed)
    tr = loader(tr.dataset, 32, collate_fn=collate, drop_last=True)
    va = loader(va.dataset, 64, shuffle=False, collate_fn=SortedCollate(True))
    model = SortedDual(len(vocab) + 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=clip_loss, max_steps=200)


fix("clip_collate_sorts_captions", fixed_of(clip_collate_sorts_captions), retrieval_acc,
    "val image->text retrieval accuracy")


def part_labels(pts):
    """Part of each point: 0 below the centroid plane z, 1 above-left, 2 above-right."""
    up = pts[..., 2] > 0
    return torch.where(up, 1 + (pts[..., 0] > 0).long(), torch.zeros_like(up, dtype=torch.long))


class PartSet(Dataset):
    """Scans of 128 points with per-point part labels; each item keeps a random subset of 64 points."""

    def __init__(self, n, s, fixed):
        self.pts, _, _ = point_clouds(n, n_points=128, s=s)
        self.seg = part_labels(self.pts)
        self.fixed, self.g = fixed, gen(s + 100)

    def __len__(self):
        return len(self.pts)

    def __getitem__(self, i):
        idx = torch.randperm(128, generator=self.g)[:64]
        seg = self.seg[i][idx] if self.fixed else self.seg[i][:64]
        return self.pts[i][idx], seg


class PointSeg(nn.Module):
    def __init__(self, n_parts=3):
        super().__init__()
        self.local = nn.Sequential(nn.Conv1d(3, 64, 1), nn.ReLU(), nn.Conv1d(64, 64, 1), nn.ReLU())
        self.out = nn.Sequential(nn.Conv1d(128, 64, 1), nn.ReLU(), nn.Conv1d(64, n_parts, 1))

    def forward(self, pts):  # (B, N, 3) -> (B, parts, N)
        f = self.local(pts.transpose(1, 2))
        g = f.max(dim=2, keepdim=True).values.expand_as(f)
        return self.out(torch.cat([f, g], 1))


@case("pc_seg_labels_not_subsampled", "targets",
      "The segmentation Dataset subsamples each scan with a random index (pts[idx]) but takes the per-point labels "
      "as seg[:64] instead of seg[idx], so the part labels no longer belong to the points they are paired with.",
      r"seg\[idx\]|labels?\[idx\]|(same|identical) (index|indices|idx)|(subsampl|index|idx|randperm).{0,80}"
      r"(label|seg|target)s?.{0,40}(not|never|without|separately)|(label|seg|target)s?.{0,80}(not|never).{0,40}"
      r"(subsampl|indexed|permuted|resampled)|per-point labels?.{0,60}(mismatch|misalign|do not (match|belong))")
def pc_seg_labels_not_subsampled(fixed=False):
    seed(0)
    tr = loader(PartSet(768, 11, fixed), 32)
    va = loader(PartSet(256, 12, True), 128, shuffle=False)
    model = PointSeg()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("pc_seg_labels_not_subsampled", fixed_of(pc_seg_labels_not_subsampled),
    acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])), "val per-point accuracy")


class WindowSet(Dataset):
    """Long annotated recordings; each item is a random 16-frame window with its per-frame labels."""

    def __init__(self, n, s, fixed, window=16):
        self.x, self.y = frame_sequences(n, length=64, s=s)
        self.fixed, self.window, self.g = fixed, window, gen(s + 1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        t0 = int(torch.randint(0, 64 - self.window + 1, (1,), generator=self.g))
        frames = self.x[i, t0:t0 + self.window]
        labels = self.y[i, t0:t0 + self.window] if self.fixed else self.y[i, :self.window]
        return frames, labels


@case("frame_labels_window_offset", "targets",
      "The Dataset cuts a random window x[t0:t0 + 16] out of each recording but slices the per-frame labels as "
      "y[:16], from frame 0 instead of from the same start t0, so the temporal labels are shifted against the "
      "frames.",
      r"t0|(same|window) (start|offset)|offset.{0,60}(label|target)|(label|target)s?.{0,80}(shift|offset|from "
      r"(frame )?0|start)|y\[:16\]|(temporal|per-frame) labels?.{0,60}(misalign|shift|do not match)")
def frame_labels_window_offset(fixed=False):
    seed(0)
    tr = loader(WindowSet(512, 21, fixed), 32)
    va = loader(WindowSet(128, 22, True), 128, shuffle=False)
    model = FrameTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("frame_labels_window_offset", fixed_of(frame_labels_window_offset),
    acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])), "val per-frame accuracy")


class ClipSet(Dataset):
    """Each video gives 3 clips of 6 consecutive frames; item i is clip i % 3 of video i // 3."""

    def __init__(self, n_videos, s, fixed, k=3):
        vid, self.labels, _ = moving_blobs(n_videos, frames=12, s=s)
        self.vid = vid.permute(0, 4, 1, 2, 3).contiguous()  # (V, C, T, H, W)
        self.k, self.fixed = k, fixed

    def __len__(self):
        return len(self.vid) * self.k

    def __getitem__(self, i):
        v, c = divmod(i, self.k)
        clip = self.vid[v, :, 3 * c:3 * c + 6]
        return clip, self.labels[v] if self.fixed else self.labels[i % len(self.labels)]


@case("video_clip_label_index", "targets",
      "The clip Dataset has k clips per video and loads clip i from video i // k, but returns labels[i] (the clip "
      "index, wrapped) instead of labels[i // k], so most clips carry another video's action label.",
      r"i ?// ?k|labels\[i\]|(clip|item) index.{0,60}(instead of|not|rather than).{0,30}video|"
      r"(label|target)s?.{0,80}(another|other|wrong|different) video|video index|clips? per video")
def video_clip_label_index(fixed=False):
    seed(0)
    tr = loader(ClipSet(384, 31, fixed), 32)
    va = loader(ClipSet(96, 32, True), 96, shuffle=False)
    model = Video3D()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("video_clip_label_index", fixed_of(video_clip_label_index), acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])),
    "val accuracy")
