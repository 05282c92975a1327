"""Set t, family shapes: a tensor reshaped, reduced or combined along the wrong axis, so every step runs and the
model learns from scrambled or mismatched values."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_t.registry import acc_on, case, dev, fix, fixed_of, gen, loader, seed, val_batches

# --------------------------------------------------------------------------------------------------------------------
# Tile segmentation: logits flattened Keras-style with .view(-1, C) on an NCHW tensor.


def rect_scenes(n: int, size: int, g: torch.Generator, n_classes: int = 3):
    """Grey tiles with three rectangles each, class c painted at intensity c / n_classes (+ noise); mask (n, H, W)."""
    mask = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        for _ in range(3):
            c = int(torch.randint(1, n_classes + 1, (1,), generator=g))
            h, w = (int(v) for v in torch.randint(3, 8, (2,), generator=g))
            y0, x0 = int(torch.randint(0, size - h, (1,), generator=g)), int(torch.randint(0, size - w, (1,), generator=g))
            mask[i, y0:y0 + h, x0:x0 + w] = c
    img = mask.float().unsqueeze(1) / n_classes + 0.25 * torch.randn(n, 1, size, size, generator=g)
    return img, mask


def small_fcn(n_out: int, c_in: int = 1, width: int = 16) -> nn.Module:
    return nn.Sequential(nn.Conv2d(c_in, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1),
                         nn.ReLU(), nn.Conv2d(width, n_out, 1))


@case("tile_seg_logits_view_not_permute", "shapes",
      bug="The segmentation loss flattens the NCHW logits with logits.view(-1, C) (a Keras channels-last habit) "
          "instead of permuting the class axis last first, so each row of the flattened logits holds C neighbouring "
          "pixels of one channel and is scored against the label of an unrelated pixel.",
      cause_pattern=r"view\(-1, ?(c|n_?cls|num_classes|n_classes)\)|\.view\b.*(nchw|channel|class (axis|dim))|"
                    r"permute\(0, ?2, ?3, ?1\)|movedim|channels?[- ]last.*(flatten|view|reshape)|"
                    r"(flatten|view|reshape)\w*.*(without|before|instead of).*(permut|transpos|moving the class)|"
                    r"class (axis|dim\w*) (is )?not (moved )?last|scrambl\w* (pixels|classes)|"
                    r"(pixels?|classes) (are )?(mixed|scrambled)|wrong pixels?|channel-first")
def tile_seg_logits_view_not_permute(fixed: bool = False) -> dict:
    seed(0)
    g = gen(1)
    x, y = rect_scenes(1200, 16, g)
    model = small_fcn(4)

    def seg_loss(model, batch):
        images, masks = batch
        logits = model(images)
        n_cls = logits.shape[1]
        if fixed:
            flat = logits.permute(0, 2, 3, 1).reshape(-1, n_cls)
        else:
            flat = logits.view(-1, n_cls)  # as in the Keras version: (N, H*W, C) -> (N*H*W, C)
        return F.cross_entropy(flat, masks.reshape(-1))

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1000], y[:1000]), 16),
                val_loader=loader(TensorDataset(x[1000:], y[1000:]), 100, shuffle=False),
                loss_fn=seg_loss, max_steps=150)


def _pixel_fwd(m, b):
    return m(b[0].to(dev(m))).argmax(1), b[1].to(dev(m))


fix("tile_seg_logits_view_not_permute", fixed_of(tile_seg_logits_view_not_permute), acc_on(val_batches, _pixel_fwd),
    "val pixel accuracy", steps=150)

# --------------------------------------------------------------------------------------------------------------------
# Colour-blob classifier ported from Keras: GlobalAveragePooling2D written as x.mean(dim=(1, 2)) on NCHW.


def colour_blobs(n: int, size: int, g: torch.Generator):
    """RGB tiles with one blob whose colour (one of 4) is the class, at a random place, on a noisy background."""
    palette = torch.tensor([[1.0, 0.2, 0.2], [0.2, 1.0, 0.2], [0.2, 0.2, 1.0], [1.0, 1.0, 0.2]])
    y = torch.randint(0, 4, (n,), generator=g)
    c = torch.rand(n, 2, generator=g) * (size - 6) + 3
    ys, xs = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    blob = torch.exp(-((xs - c[:, 0, None, None]) ** 2 + (ys - c[:, 1, None, None]) ** 2) / 4.5)
    img = blob[:, None] * palette[y][:, :, None, None] + 0.3 * torch.randn(n, 3, size, size, generator=g)
    return img, y


class BlobNet(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                      nn.ReLU())
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = self.features(x)
        pooled = h.mean(dim=(2, 3)) if self.fixed else h.mean(dim=(1, 2))  # keras: GlobalAveragePooling2D()
        return self.head(pooled)


@case("colour_blob_gap_mean_wrong_axes", "shapes",
      bug="Global average pooling ported from Keras (channels-last) as h.mean(dim=(1, 2)) averages the NCHW feature "
          "map over channels and height instead of height and width, so the head sees a per-column profile (16 "
          "columns, the same width as the 16 channels) and the channel features are averaged away.",
      cause_pattern=r"mean\(dim=\(1, ?2\)\)|dim=\(2, ?3\)|adaptive_avg_pool|AdaptiveAvgPool|"
                    r"(averag|mean|pool)\w*.*over (the )?channels?|channels?[- ]last.*(pool|mean|averag)|"
                    r"(pool|mean|averag)\w*.*(wrong|spatial) (axes|dim\w*)|GlobalAveragePooling|"
                    r"(channel|height) (and|&) (height|width).*instead")
def colour_blob_gap_mean_wrong_axes(fixed: bool = False) -> dict:
    seed(0)
    x, y = colour_blobs(1500, 16, gen(2))
    model = BlobNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


def _cls_fwd(m, b):
    return m(b[0].to(dev(m))).argmax(-1), b[-1].to(dev(m))


fix("colour_blob_gap_mean_wrong_axes", fixed_of(colour_blob_gap_mean_wrong_axes), acc_on(val_batches, _cls_fwd),
    "val accuracy", steps=200)

# --------------------------------------------------------------------------------------------------------------------
# Image + metadata model: the two branch embeddings stacked along dim 0 and .view(B, -1)-ed.


def image_meta(n: int, g: torch.Generator):
    """A blob left or right in a 12x12 tile (bit a) and 6 metadata columns whose sign along w is bit b; y = 2a + b."""
    side = torch.randint(0, 2, (n,), generator=g)
    cx = torch.where(side == 1, 8.5, 2.5) + torch.rand(n, generator=g)
    cy = torch.rand(n, generator=g) * 8 + 2
    ys, xs = torch.meshgrid(torch.arange(12).float(), torch.arange(12).float(), indexing="ij")
    img = torch.exp(-((xs - cx[:, None, None]) ** 2 + (ys - cy[:, None, None]) ** 2) / 3.0)[:, None]
    img = img + 0.2 * torch.randn(n, 1, 12, 12, generator=g)
    meta = torch.randn(n, 6, generator=g)
    w = torch.tensor([1.0, -1.0, 0.5, 0.0, 0.8, -0.3])
    bit = (meta @ w > 0).long()
    return img, meta, 2 * side + bit


class ImageMetaNet(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.image_branch = nn.Sequential(nn.Flatten(), nn.Linear(144, 32), nn.ReLU(), nn.Linear(32, 16))
        self.meta_branch = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, image, meta):
        a, b = self.image_branch(image), self.meta_branch(meta)
        if self.fixed:
            fused = torch.stack([a, b], dim=1).view(a.size(0), -1)
        else:
            fused = torch.stack([a, b]).view(a.size(0), -1)
        return self.head(fused)


@case("image_meta_stack_view_mixes_samples", "shapes",
      bug="The two-branch model fuses its image and metadata embeddings with torch.stack([a, b]).view(B, -1): "
          "stacking along dim 0 gives (2, B, 16), and viewing that as (B, 32) puts the embeddings of samples 2i and "
          "2i+1 (or two metadata rows) in row i, so each label is paired with other samples' features.",
      cause_pattern=r"stack\(\[a, ?b\]\)|stack\w*.*(dim ?0|dim=0|first (axis|dim))|dim=1\)|torch\.cat\(.*dim=1|"
                    r"(view|reshape)\w*.*(batch|sample)s? .*(mix|scrambl|interleav|other)|"
                    r"(mix|scrambl|interleav)\w* (the )?(samples|batch|rows)|"
                    r"(rows?|embeddings?) of (other|different|neighbouring|adjacent) samples|"
                    r"\(2, ?B, ?16\)|concatenat\w* along (the )?(feature|last) (dim|axis)|"
                    r"depends? on (the )?other samples")
def image_meta_stack_view_mixes_samples(fixed: bool = False) -> dict:
    seed(0)
    img, meta, y = image_meta(1500, gen(3))

    def fused_loss(model, batch):
        image, m, target = batch
        return F.cross_entropy(model(image, m), target)

    model = ImageMetaNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(img[:1200], meta[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(img[1200:], meta[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=fused_loss, max_steps=250)


def _image_meta_fwd(m, b):
    d = dev(m)
    return m(b[0].to(d), b[1].to(d)).argmax(-1), b[2].to(d)


fix("image_meta_stack_view_mixes_samples", fixed_of(image_meta_stack_view_mixes_samples),
    acc_on(val_batches, _image_meta_fwd), "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# Multiple-instance learning: attention pooling with the softmax over the batch axis instead of the instances.


def bags(n: int, k: int, d: int, g: torch.Generator):
    """Bags of k instances; a positive bag holds one key instance drawn around a fixed direction."""
    x = torch.randn(n, k, d, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    key = torch.randn(d, generator=g)
    key = 4.0 * key / key.norm()
    pos = torch.randint(0, k, (n,), generator=g)
    x[torch.arange(n), pos] += key * y[:, None]
    return x, y


class AttentionMIL(nn.Module):
    def __init__(self, fixed: bool, d: int = 16):
        super().__init__()
        self.fixed = fixed
        self.encoder = nn.Sequential(nn.Linear(d, 32), nn.ReLU())
        self.attention = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 1))
        self.classifier = nn.Linear(32, 2)

    def forward(self, bag):  # bag: (B, K, D)
        h = self.encoder(bag)
        scores = self.attention(h)  # (B, K, 1)
        w = torch.softmax(scores, dim=1 if self.fixed else 0)
        return self.classifier((w * h).sum(dim=1))


@case("mil_attention_softmax_over_batch", "shapes",
      bug="The attention-MIL pooling normalises the instance scores of shape (B, K, 1) with softmax(dim=0), over "
          "the bags of the batch instead of the K instances of each bag, so a bag's pooled vector depends on the "
          "other bags in the batch, its weights do not sum to one, and at validation (one slide per batch) every "
          "weight is 1.",
      cause_pattern=r"softmax\(.*dim=0|dim=1\b|softmax\w* (over|along|across) (the )?(batch|bags)|"
                    r"(over|along|across) (the )?batch (axis|dim\w*) instead|"
                    r"instances? (axis|dim\w*)|(weights|attention) (do not|don't|doesn't) sum to (one|1) "
                    r"(per|over|within|for each) (bag|sample)|depends? on (the )?other (bags|samples)")
def mil_attention_softmax_over_batch(fixed: bool = False) -> dict:
    seed(0)
    x, y = bags(2000, 8, 16, gen(4))
    model = AttentionMIL(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 1, shuffle=False),  # one slide at a time
                loss_fn=nn.CrossEntropyLoss(), max_steps=250)


fix("mil_attention_softmax_over_batch", fixed_of(mil_attention_softmax_over_batch), acc_on(val_batches, _cls_fwd),
    "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# Siamese verification: a (N, 1) label against a (N,) distance broadcasts the contrastive loss to (N, N).


def glyph_pairs(n: int, g: torch.Generator, n_classes: int = 10, size: int = 12):
    """Pairs of noisy, shifted copies of random glyph templates; label 1.0 when both come from the same glyph."""
    templates = (torch.rand(n_classes, size, size, generator=g) > 0.6).float()
    a = torch.randint(0, n_classes, (n,), generator=g)
    same = torch.rand(n, generator=g) < 0.5
    b = torch.where(same, a, (a + torch.randint(1, n_classes, (n,), generator=g)) % n_classes)

    def render(idx):
        img = templates[idx]
        shift = torch.randint(-1, 2, (2,), generator=g)
        img = torch.roll(img, (int(shift[0]), int(shift[1])), dims=(1, 2))
        return (img + 0.3 * torch.randn(img.shape, generator=g))[:, None]

    label = same.float()[:, None]  # the dataset yields torch.tensor([float(same)]) per pair
    return render(a), render(b), label


def glyph_encoder() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(144, 8))


MARGIN = 2.0


@case("siamese_label_column_broadcasts_loss", "shapes",
      bug="The contrastive loss multiplies a (N, 1) label column by the (N,) pairwise distances, which broadcasts "
          "to an (N, N) matrix: every pair's distance is weighted by every other pair's label, so no pair is "
          "pulled or pushed according to its own label.",
      cause_pattern=r"broadcast\w*.{0,80}(label|distance|pair)|(label|distance|pair)\w*.{0,80}broadcast|"
                    r"(label|similarity)\w* (column )?(of shape )?\(\w+, ?1\).{0,60}(distance|pairwise)|"
                    r"pairwise_distance.{0,80}(\(\w+,?\)|shape)|every other pair|outer product")
def siamese_label_column_broadcasts_loss(fixed: bool = False) -> dict:
    seed(0)
    a, b, label = glyph_pairs(1600, gen(5))

    def contrastive(model, batch):
        x1, x2, same = batch
        if fixed:
            same = same.view(-1)
        d = F.pairwise_distance(model(x1), model(x2))
        return torch.mean(same * d ** 2 + (1 - same) * torch.clamp(MARGIN - d, min=0) ** 2)

    model = glyph_encoder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(a[:1300], b[:1300], label[:1300]), 32),
                val_loader=loader(TensorDataset(a[1300:], b[1300:], label[1300:]), 100, shuffle=False),
                loss_fn=contrastive, max_steps=250)


def pair_fwd(m, b):
    d = dev(m)
    dist = F.pairwise_distance(m(b[0].to(d)), m(b[1].to(d)))
    return (dist < MARGIN / 2).long(), b[2].to(d).view(-1).long()


fix("siamese_label_column_broadcasts_loss", fixed_of(siamese_label_column_broadcasts_loss),
    acc_on(val_batches, pair_fwd), "val verification accuracy", steps=250)
