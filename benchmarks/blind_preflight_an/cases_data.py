"""Set an, family data: augmentation, normalisation and label-encoding pipelines that corrupt what the model sees."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_an.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    seed,
)


def _dev(m):
    return next(m.parameters()).device


def _cls_fwd(m, b):
    return m(b[0].to(_dev(m))).argmax(-1).cpu(), b[1]


# ----------------------------------------------------------------------------------------------------------------
# A cached-waveform dataset normalised in place in __getitem__: the cache is re-normalised every epoch.

def waveforms(n: int, s: int, d: int = 64, classes: int = 4):
    """Vibration clips whose class is the loudness level of a tone of random frequency and phase."""
    g = gen(s)
    y = torch.randint(0, classes, (n,), generator=g)
    t = torch.linspace(0, 1, d)
    levels = torch.tensor([0.4, 0.8, 1.4, 2.2])
    freq = 2.0 + 6.0 * torch.rand(n, 1, generator=g)
    phase = 6.28 * torch.rand(n, 1, generator=g)
    x = levels[y].unsqueeze(1) * torch.sin(6.2832 * freq * t + phase) + 0.1 * torch.randn(n, d, generator=g)
    return x + 2.0, y  # raw sensor scale: DC offset 2


class CachedClips(Dataset):
    def __init__(self, x, y, mean, std, fixed):
        self.x, self.y, self.mean, self.std, self.fixed = x, y, mean, std, fixed

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        clip = self.x[i]
        if self.fixed:
            clip = (clip - self.mean) / self.std
        else:
            clip.sub_(self.mean).div_(self.std)  # in place, "no extra copy"
        return clip, self.y[i]


def build_inplace_norm_cache(fixed: bool = False) -> dict:
    seed(0)
    x, y = waveforms(1100, 41)
    tr_x, va_x = x[:800].clone(), x[800:].clone()
    mean, std = tr_x.mean().item(), tr_x.std().item()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(CachedClips(tr_x, y[:800], mean, std, fixed), 32),
                val_loader=loader(TensorDataset((va_x - mean) / std, y[800:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


case("an_data_inplace_norm_cache", "data",
     "The dataset's __getitem__ normalises the cached clip in place (clip.sub_(mean).div_(std)) on a view of the "
     "stored tensor, so every epoch normalises the cache again: the training clips drift further in offset and "
     "scale epoch after epoch while the validation clips are normalised once.",
     r"in[- ]place|sub_|div_|(normali[sz]|transform)\w*.{0,60}(again|repeatedly|every epoch|each epoch|twice|cumulat)|"
     r"(inputs?|data|features|batches).{0,60}(shrink|drift|change|differ) (from|between|across|over|with|every|each) "
     r"(epoch|pass)|(same|identical) (sample|index|item)s?.{0,60}(differ|change)|"
     r"(modif|mutat|overwrit)\w*.{0,40}(dataset|cache|stored)")(build_inplace_norm_cache)
fix("an_data_inplace_norm_cache", fixed_of(build_inplace_norm_cache), acc_of(_cls_fwd), "val accuracy")


# ----------------------------------------------------------------------------------------------------------------
# Scale augmentation resizing the segmentation mask with bilinear interpolation, then .long() truncating it.

def thin_structures(n: int, s: int, size: int = 24):
    """Images with thin bright (class 1) and dark (class 2) bars; the mask names them."""
    g = gen(s)
    x = 0.3 * torch.randn(n, 1, size, size, generator=g)
    m = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        for _ in range(4):
            c = int(torch.randint(1, 3, (1,), generator=g))
            r, q = (int(v) for v in torch.randint(0, size - 8, (2,), generator=g))
            if torch.rand(1, generator=g) < 0.5:
                m[i, r:r + 2, q:q + 8] = c
            else:
                m[i, r:r + 8, q:q + 2] = c
    x = x + (m == 1).float().unsqueeze(1) - (m == 2).float().unsqueeze(1)
    return x, m


class ZoomSeg(Dataset):
    """Random zoom-in: resize by 1.2-1.6 and crop back to the original size (image bilinear; mask as written)."""

    def __init__(self, x, m, fixed, augment=True, s=0):
        self.x, self.m, self.fixed, self.augment = x, m, fixed, augment
        self.g = gen(s)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        img, mask = self.x[i], self.m[i]
        if not self.augment:
            return img, mask
        size = img.shape[-1]
        scale = 1.2 + 0.4 * float(torch.rand(1, generator=self.g))
        new = int(round(size * scale))
        img = F.interpolate(img[None], size=(new, new), mode="bilinear", align_corners=False)[0]
        mode = "nearest" if self.fixed else "bilinear"
        kw = {} if self.fixed else {"align_corners": False}
        mask = F.interpolate(mask[None, None].float(), size=(new, new), mode=mode, **kw)[0, 0].long()
        o = int(torch.randint(0, new - size + 1, (1,), generator=self.g))
        return img[:, o:o + size, o:o + size], mask[o:o + size, o:o + size]


class SegNet(nn.Module):
    def __init__(self, classes: int = 3):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                  nn.ReLU(), nn.Conv2d(16, classes, 1))

    def forward(self, x):
        return self.body(x)


def build_mask_bilinear(fixed: bool = False) -> dict:
    seed(0)
    x, m = thin_structures(1100, 42)
    model = SegNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ZoomSeg(x[:900], m[:900], fixed, s=1), 32),
                val_loader=loader(ZoomSeg(x[900:], m[900:], fixed, augment=False), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


def seg_fg_iou(model, kw):
    """Mean IoU of the two foreground classes on the un-augmented validation masks."""
    inter = torch.zeros(3)
    union = torch.zeros(3)
    model.eval()
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            p = model(x.to(_dev(model))).argmax(1).cpu()
            for c in (1, 2):
                inter[c] += ((p == c) & (y == c)).sum()
                union[c] += ((p == c) | (y == c)).sum()
    model.train()
    return float((inter[1:] / union[1:].clamp(min=1)).mean())


case("an_data_mask_bilinear", "data",
     "The random-zoom augmentation resizes the integer segmentation mask with F.interpolate(mode='bilinear') and "
     "then .long(): class ids are blended at every boundary and truncated (a 2 next to a 0 becomes 1, 1.9999 "
     "becomes 1), so the training masks carry wrong classes; masks must be resized with mode='nearest'.",
     r"nearest|bilinear|interpolat\w*.{0,80}(mask|label|target|class id)|"
     r"(mask|label|target)s?.{0,80}(interpolat|blend|averag|truncat)|"
     r"(non-?integer|fractional|in-between|intermediate) (class|label)|"
     r"(class|label) (ids?|values?).{0,60}(not|never) (in|present|seen).{0,40}(original|source|validation)")(
    build_mask_bilinear)
fix("an_data_mask_bilinear", fixed_of(build_mask_bilinear), seg_fg_iou, "val foreground mIoU")


# ----------------------------------------------------------------------------------------------------------------
# Multi-label tag vocabulary fitted separately on the validation split, which lacks one tag: the columns shift.

TAG_NAMES = ["bark", "car_horn", "chainsaw", "dog", "engine", "footsteps", "rain", "siren", "speech", "wind"]


def tagged_clips(n: int, s: int, d: int = 32, drop_tag: str | None = None):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, len(TAG_NAMES), generator=gen(99)) / d ** 0.5
    on = x @ w > 0.5
    if drop_tag is not None:  # this split happens to have no clip with this tag
        on[:, TAG_NAMES.index(drop_tag)] = False
    tags = [[TAG_NAMES[k] for k in range(len(TAG_NAMES)) if on[i, k]] for i in range(n)]
    return x, tags


def binarize(tags, vocab):
    y = torch.zeros(len(tags), len(vocab))
    for i, ts in enumerate(tags):
        for t in ts:
            y[i, vocab.index(t)] = 1.0
    return y


def build_val_tag_vocab(fixed: bool = False) -> dict:
    seed(0)
    tr_x, tr_tags = tagged_clips(2000, 43)
    va_x, va_tags = tagged_clips(400, 44, drop_tag="car_horn")
    train_vocab = sorted({t for ts in tr_tags for t in ts})
    val_vocab = train_vocab if fixed else sorted({t for ts in va_tags for t in ts})  # "fit" on each split
    ytr = binarize(tr_tags, train_vocab)
    yva = torch.zeros(len(va_tags), len(train_vocab))
    yva[:, :len(val_vocab)] = binarize(va_tags, val_vocab)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, len(train_vocab)))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(tr_x, ytr), 32),
                val_loader=loader(TensorDataset(va_x, yva), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=1500)


def val_tag_f1(model, kw):
    tp = fp = fn_ = 0.0
    model.eval()
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            p = (model(x.to(_dev(model))).float().cpu() > 0).float()
            tp += (p * y).sum().item()
            fp += (p * (1 - y)).sum().item()
            fn_ += ((1 - p) * y).sum().item()
    model.train()
    return 2 * tp / max(2 * tp + fp + fn_, 1.0)


case("an_data_val_tag_vocab", "data",
     "The multi-label tag vocabulary (a MultiLabelBinarizer-style sorted set of tag names) is fitted separately on "
     "the validation split, which has no 'car_horn' clip, so every validation tag column after it is shifted by one "
     "relative to the training columns.",
     r"(vocab\w*|label (encoder|mapping|map)|class(es)?[_ ]to[_ ]idx|binari[sz]er|tag (order|columns?)).{0,80}"
     r"(separate|differ|mismatch|refit|re-?fitted|each split|validation)|"
     r"(label|tag|class|column) (order|index|indices|mapping) (differ|mismatch|shift)|"
     r"(columns?|labels?|tags?|classes) (are |is )?(shifted|permuted|swapped|misaligned)|MultiLabelBinarizer|"
     r"(fit|fitted) (only )?on the (training|train) (split|set)")(build_val_tag_vocab)
fix("an_data_val_tag_vocab", fixed_of(build_val_tag_vocab), val_tag_f1, "val micro F1")


# ----------------------------------------------------------------------------------------------------------------
# Train images scaled to [0, 1] then normalised; the validation pipeline forgot the / 255.

MEAN, STD = 0.45, 0.25


def stripes(n: int, s: int, size: int = 16):
    """uint8-range grey images with horizontal, vertical or diagonal stripes (class) at random phase."""
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    yy, xx = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    imgs = torch.empty(n, 1, size, size)
    for i in range(n):
        ph = 6.28 * float(torch.rand(1, generator=g))
        coord = (yy, xx, (yy + xx) / 1.41)[int(y[i])]
        imgs[i, 0] = 115 + 60 * torch.sin(coord * 1.2 + ph) + 30 * torch.randn(size, size, generator=g)
    return imgs.clamp(0, 255).round(), y


class StripeCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.f(x).mean(dim=(2, 3)))


def build_val_unscaled(fixed: bool = False) -> dict:
    seed(0)
    raw, y = stripes(1400, 45)
    train = (raw[:1100] / 255.0 - MEAN) / STD  # ToTensor() then Normalize
    val_raw = raw[1100:]
    val = (val_raw / 255.0 - MEAN) / STD if fixed else (val_raw - MEAN) / STD  # from_numpy().float(), Normalize
    model = StripeCNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(train, y[:1100]), 32),
                val_loader=loader(TensorDataset(val, y[1100:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


case("an_data_val_unscaled", "data",
     "The training images go through ToTensor (scaling 0-255 to [0, 1]) then Normalize, but the validation pipeline "
     "builds tensors with torch.from_numpy(...).float() and only Normalize, so validation inputs are 255 times "
     "larger than anything the model was trained on.",
     r"\b(validation|val|eval)\b.{0,80}\b255\b|\b255\b.{0,80}\b(validation|val|eval)\b|"
     r"\b(validation|val|eval)\b.{0,80}(scale|range|statistic|distribution|normali[sz])\w*.{0,40}"
     r"(differ|mismatch|not (match|the same)|unlike|inconsistent)|"
     r"(train|training)\w*.{0,40}(and|vs\.?|versus) (validation|val)\w*.{0,60}(scale|range|magnitude|statistic)|"
     r"ToTensor|\b(validation|val|eval)\b.{0,60}(not|never) (scaled|divided)|"
     r"same (preprocessing|transforms?|normali[sz]ation)")(build_val_unscaled)
fix("an_data_val_unscaled", fixed_of(build_val_unscaled), acc_of(_cls_fwd), "val accuracy")


# ----------------------------------------------------------------------------------------------------------------
# Horizontal flip drawn separately for the image and for its mask.

def side_objects(n: int, s: int, size: int = 16):
    """A bright object on the left or the right half; the mask marks it (class 1)."""
    g = gen(s)
    x = 0.4 * torch.randn(n, 1, size, size, generator=g)
    m = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        h, w = (int(v) for v in torch.randint(3, 6, (2,), generator=g))
        r = int(torch.randint(0, size - h, (1,), generator=g))
        c = int(torch.randint(0, size // 2 - w, (1,), generator=g))
        if torch.rand(1, generator=g) < 0.5:
            c = size - w - c
        m[i, r:r + h, c:c + w] = 1
    return x + m.float().unsqueeze(1), m


class FlipSeg(Dataset):
    def __init__(self, x, m, fixed, s=0):
        self.x, self.m, self.fixed = x, m, fixed
        self.g = gen(s)

    def __len__(self):
        return len(self.x)

    def _coin(self):
        return bool(torch.rand(1, generator=self.g) < 0.5)

    def __getitem__(self, i):
        img, mask = self.x[i], self.m[i]
        flip_img = self._coin()
        flip_mask = flip_img if self.fixed else self._coin()  # RandomHorizontalFlip applied to each separately
        if flip_img:
            img = img.flip(-1)
        if flip_mask:
            mask = mask.flip(-1)
        return img, mask


def build_seg_flip_independent(fixed: bool = False) -> dict:
    seed(0)
    x, m = side_objects(1200, 46)
    model = SegNet(classes=2)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(FlipSeg(x[:1000], m[:1000], fixed, s=2), 32),
                val_loader=loader(TensorDataset(x[1000:], m[1000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


def fg_iou(model, kw):
    def fn(mdl, b):
        p = mdl(b[0].to(_dev(mdl))).argmax(1).cpu() == 1
        t = b[1] == 1
        return (p & t).sum().item(), (p | t).sum().item()
    return mean_over(model, kw["val_loader"], fn)


case("an_data_seg_flip_independent", "data",
     "The augmentation applies RandomHorizontalFlip to the image and, with a separate random draw, to the mask, so "
     "half of the training pairs have the mask mirrored relative to its image.",
     r"(image|input)s? and (its |the )?(mask|label|target)s?.{0,80}(separate|independent|different|own) "
     r"(random|draw|coin|flip|seed)|(separate|independent|different) (random )?(draws?|flips?|coins?|seeds?|calls?).{0,60}"
     r"(image|mask)|masks?.{0,60}(mirrored|flipped|misaligned|not aligned|out of sync|desync)|"
     r"(image|input)s? and (its |their |the )?(masks?|labels?|targets?).{0,40}(misaligned|not aligned|out of (sync|register))|"
     r"same (random )?(flip|transform|parameters) (to|for) (both|image and mask)|joint(ly)? (transform|augment)")(
    build_seg_flip_independent)
fix("an_data_seg_flip_independent", fixed_of(build_seg_flip_independent), fg_iou, "val foreground IoU")
