"""Targets: what the loss is told the right answer is (masks, ignore indices, box formats, class indices, heatmaps)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_u.registry import acc_of, box_iou, case, fix, fixed_of, loader, on_truth, rng, seed


def _fcn(cin, cout, width=16):
    return nn.Sequential(nn.Conv2d(cin, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1),
                         nn.ReLU(), nn.Conv2d(width, cout, 1))


# --- 1. torchvision-style to_tensor applied to the class-index mask --------------------------------------------------

def to_tensor(arr):
    """What transforms.ToTensor does to a uint8 HWC array: CHW float in [0, 1]."""
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))).float().div(255)


class RoofTiles(Dataset):
    """Aerial tiles with roofs (1), solar panels (2) and pools (3); masks are uint8 class-index PNGs."""

    def __init__(self, n, s, fixed):
        r = rng(s)
        self.fixed = fixed
        self.images = np.clip(r.normal(90, 20, (n, 16, 16, 3)), 0, 255)
        self.masks = np.zeros((n, 16, 16), dtype=np.uint8)
        colour = np.array([[170, 80, 60], [30, 40, 90], [60, 170, 220]])
        for i in range(n):
            for _ in range(3):
                k, y, x, h, w = r.integers(3), *r.integers(0, 11, 2), *r.integers(3, 7, 2)
                self.masks[i, y:y + h, x:x + w] = k + 1
                self.images[i, y:y + h, x:x + w] = colour[k] + r.normal(0, 12, 3)
        self.images = self.images.astype(np.uint8)
        self.truth_x = torch.stack([to_tensor(im) for im in self.images])
        self.truth_y = torch.from_numpy(self.masks.astype(np.int64))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = to_tensor(self.images[i])
        if self.fixed:
            mask = torch.from_numpy(self.masks[i].astype(np.int64))
        else:
            mask = to_tensor(self.masks[i][:, :, None]).squeeze(0).long()
        return image, mask


@case("roof_mask_through_to_tensor", "targets",
      bug="The uint8 class-index mask goes through the same ToTensor-style transform as the image, which divides by "
          "255: class ids 1, 2, 3 become 0.004-0.012 and .long() truncates them to 0, so every target pixel is "
          "background.",
      cause_pattern=r"to_?tensor.{0,80}mask|mask.{0,80}(divid\w*|scaled|/ ?255|\[0, ?1\])"
                    r"|(class|label) (ids?|indices).{0,60}(scaled|divided|255|truncat)"
                    r"|(targets?|masks?|labels?).{0,40}(all|only) (0|zero|background)")
def roof_masks(fixed=False):
    seed(0)
    model = _fcn(3, 4)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(RoofTiles(800, 11, fixed), 16),
                val_loader=loader(RoofTiles(200, 12, fixed), 50, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


def true_pixel_acc(model, kw):
    ds = kw["val_loader"].dataset
    pred = on_truth(model, ds.truth_x, lambda m, x: m(x).argmax(1))
    return (pred == ds.truth_y).float().mean().item()


fix("roof_mask_through_to_tensor", fixed_of(roof_masks), true_pixel_acc, "val pixel accuracy (true masks)")


# --- 2. ignore_index=0 copied from a repo where 0 was the void label -------------------------------------------------

def _leaf_scans(n, s):
    """Leaf scans: healthy tissue (0, most pixels), rust spots (1), blight patches (2)."""
    r = rng(s)
    img = np.empty((n, 3, 16, 16), dtype=np.float32)
    img[:] = np.array([0.2, 0.6, 0.2], dtype=np.float32)[:, None, None]
    img += r.normal(0, 0.06, img.shape).astype(np.float32)
    mask = np.zeros((n, 16, 16), dtype=np.int64)
    yy, xx = np.mgrid[:16, :16]
    tint = np.array([[0.7, 0.4, 0.1], [0.35, 0.3, 0.25]], dtype=np.float32)
    for i in range(n):
        for _ in range(r.integers(1, 4)):
            k, cy, cx, rad = r.integers(2), r.uniform(0, 16), r.uniform(0, 16), r.uniform(1, 3)
            spot = (yy - cy) ** 2 + (xx - cx) ** 2 < rad ** 2
            mask[i][spot] = k + 1
            img[i][:, spot] = tint[k][:, None] + r.normal(0, 0.05, (3, 1))
    return torch.from_numpy(img), torch.from_numpy(mask)


@case("leaf_ignore_index_zero", "targets",
      bug="The leaf-disease segmenter uses nn.CrossEntropyLoss(ignore_index=0), copied from a repo where 0 was the "
          "void label, but here 0 is the healthy-tissue class that covers most pixels: no pixel ever teaches the "
          "model what healthy tissue is, and it paints disease everywhere.",
      cause_pattern=r"ignore_index ?= ?0|ignor\w*.{0,60}(class|label|index) 0\b|(class|label) 0.{0,60}ignor"
                    r"|background.{0,60}(ignored|never (learn|train|scor)|excluded)")
def leaf_ignore(fixed=False):
    seed(0)
    xtr, mtr = _leaf_scans(800, 13)
    xva, mva = _leaf_scans(200, 14)
    model = _fcn(3, 3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xtr, mtr), 16),
                val_loader=loader(TensorDataset(xva, mva), 50, shuffle=False),
                loss_fn=nn.CrossEntropyLoss() if fixed else nn.CrossEntropyLoss(ignore_index=0), max_steps=300)


fix("leaf_ignore_index_zero", fixed_of(leaf_ignore), acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])),
    "val pixel accuracy")


# --- 3. COCO [x, y, w, h] boxes fed to an IoU loss that reads x1, y1, x2, y2 -----------------------------------------

class ParcelCrops(Dataset):
    """One parcel per 24x24 warehouse crop; annotations exported as COCO JSON (bbox = [x, y, width, height])."""

    def __init__(self, n, s, fixed):
        r = rng(s)
        self.fixed = fixed
        self.images = r.normal(0.25, 0.05, (n, 1, 24, 24)).astype(np.float32)
        self.annotations = []
        for i in range(n):
            w, h = r.integers(4, 13, 2)
            x, y = r.integers(0, 24 - w), r.integers(0, 24 - h)
            self.images[i, 0, y:y + h, x:x + w] = 0.8 + r.normal(0, 0.05)
            self.annotations.append({"image_id": i, "category_id": 1, "bbox": [float(x), float(y), float(w), float(h)]})
        self.images = torch.from_numpy(self.images)
        self.truth = torch.tensor([[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2],
                                    a["bbox"][1] + a["bbox"][3]] for a in self.annotations]) / 24

    def __len__(self):
        return len(self.annotations)

    def __getitem__(self, i):
        box = torch.tensor(self.annotations[i]["bbox"]) / 24
        if self.fixed:
            box = torch.cat([box[:2], box[:2] + box[2:]])
        return self.images[i], box


def _box_net():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 36, 64), nn.ReLU(), nn.Linear(64, 4), nn.Sigmoid())


def l1_iou_loss(model, batch):
    x, box = batch
    pred = model(x)                                   # (x1, y1, x2, y2) in [0, 1]
    lt = torch.maximum(pred[:, :2], box[:, :2])
    rb = torch.minimum(pred[:, 2:], box[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(1)
    area_p = (pred[:, 2:] - pred[:, :2]).clamp(min=0).prod(1)
    area_b = (box[:, 2:] - box[:, :2]).clamp(min=0).prod(1)
    iou = inter / (area_p + area_b - inter + 1e-6)
    return F.l1_loss(pred, box) + (1 - iou).mean()


@case("parcel_coco_xywh_as_xyxy", "targets",
      bug="The parcel boxes come from COCO JSON as [x, y, width, height] but are passed straight to a loss that reads "
          "them as (x1, y1, x2, y2): the 'right/bottom corner' targets are the box size, often left of or above the "
          "top-left corner, so the model learns to output widths where corners belong.",
      cause_pattern=r"xywh|\[x, ?y, ?w(idth)?, ?h(eight)?\]|COCO.{0,60}(format|bbox|box)|xyxy|box_convert"
                    r"|x1, ?y1, ?x2, ?y2|(width|w), ?(height|h).{0,60}(x2|xmax|corner)|box format")
def parcel_boxes(fixed=False):
    seed(0)
    model = _box_net()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(ParcelCrops(1000, 15, fixed), 32),
                val_loader=loader(ParcelCrops(300, 16, fixed), 100, shuffle=False),
                loss_fn=l1_iou_loss, max_steps=300)


def true_iou(model, kw):
    ds = kw["val_loader"].dataset
    pred = on_truth(model, ds.images, lambda m, x: m(x))
    return box_iou(pred, ds.truth).mean().item()


fix("parcel_coco_xywh_as_xyxy", fixed_of(parcel_boxes), true_iou, "val IoU (true xyxy boxes)")


# --- 4. an ImageFolder-style class list that counts .ipynb_checkpoints in train/ only ---------------------------------

def _fabric_swatch(kind, r):
    """Fabric defects: 'hole' (dark spot), 'stain' (warm blotch), 'thread' (bright line)."""
    img = r.normal(0.5, 0.05, (3, 12, 12)).astype(np.float32)
    y, x = r.integers(2, 10, 2)
    if kind == "hole":
        img[:, y - 1:y + 2, x - 1:x + 2] = 0.05
    elif kind == "stain":
        img[0, y - 2:y + 2, x - 2:x + 2] += 0.35
        img[2, y - 2:y + 2, x - 2:x + 2] -= 0.2
    else:
        img[:, y, :] = 0.95
    return img


def _folder(n_per, s, with_checkpoints):
    """An in-memory directory tree: {class folder: [images]} as os.listdir would show it."""
    r = rng(s)
    tree = {kind: [_fabric_swatch(kind, r) for _ in range(n_per)] for kind in ("hole", "stain", "thread")}
    if with_checkpoints:          # Jupyter left copies of a few images being inspected
        tree[".ipynb_checkpoints"] = [_fabric_swatch("stain", r) for _ in range(4)]
    return tree


def find_classes(tree, fixed):
    names = sorted(d for d in tree if not (fixed and d.startswith(".")))
    return names, {name: i for i, name in enumerate(names)}


class SwatchFolder(Dataset):
    def __init__(self, tree, fixed):
        self.classes, self.class_to_idx = find_classes(tree, fixed)
        self.samples = [(img, self.class_to_idx[d]) for d in self.classes for img in tree[d]]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        img, label = self.samples[i]
        return torch.from_numpy(img), label


@case("swatch_folder_hidden_checkpoint_class", "targets",
      bug="The class list is built like ImageFolder (sorted folder names) and train/ contains a stray "
          ".ipynb_checkpoints folder that val/ does not: it sorts first and takes index 0, so every training class "
          "index is shifted by one relative to the validation labels (hole=1 in train, 0 in val).",
      cause_pattern=r"ipynb_checkpoints|hidden (folder|director)|class_to_idx"
                    r"|(train\w*|val\w*).{0,60}(class|label) (mapping|indices|order).{0,40}(differ|mismatch|shift)"
                    r"|label (mapping|indices).{0,40}(differ|mismatch|shift|off by one)|off[- ]by[- ]one")
def swatch_folder(fixed=False):
    seed(0)
    train = SwatchFolder(_folder(300, 17, True), fixed)
    val = SwatchFolder(_folder(100, 18, False), True)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1),
                          nn.Flatten(), nn.Linear(32, len(train.classes)))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=250)


fix("swatch_folder_hidden_checkpoint_class", fixed_of(swatch_folder),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)


# --- 5. keypoint heatmaps drawn with meshgrid axes swapped ----------------------------------------------------------

def gaussian_heatmap(cx, cy, size, fixed, sigma=1.2):
    if fixed:
        xx, yy = np.meshgrid(np.arange(size), np.arange(size))            # xx varies along columns
    else:
        xx, yy = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    return np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * sigma ** 2)).astype(np.float32)


class BoltPlates(Dataset):
    """Inspection plates with two landmarks: the bolt head (bright square, kp 0) and the nut (dark ring, kp 1)."""

    def __init__(self, n, s, fixed):
        r = rng(s)
        self.images = r.normal(0.5, 0.04, (n, 1, 16, 16)).astype(np.float32)
        self.coords = np.zeros((n, 2, 2), dtype=np.float32)
        self.heatmaps = np.zeros((n, 2, 16, 16), dtype=np.float32)
        for i in range(n):
            for k in range(2):
                cx, cy = r.integers(2, 14, 2)
                if k == 0:
                    self.images[i, 0, cy - 1:cy + 2, cx - 1:cx + 2] = 0.95
                else:
                    self.images[i, 0, cy - 1:cy + 2, cx - 1:cx + 2] = 0.1
                    self.images[i, 0, cy, cx] = 0.5
                self.coords[i, k] = (cx, cy)
                self.heatmaps[i, k] = gaussian_heatmap(cx, cy, 16, fixed)
        self.images, self.heatmaps = torch.from_numpy(self.images), torch.from_numpy(self.heatmaps)
        self.coords = torch.from_numpy(self.coords)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.heatmaps[i]


def heatmap_loss(model, batch):
    x, hm = batch
    return ((model(x) - hm) ** 2).sum((1, 2, 3)).mean()


@case("bolt_heatmap_meshgrid_ij", "targets",
      bug="The target heatmaps are drawn with np.meshgrid(..., indexing='ij') but the formula treats the first grid "
          "as x (columns): each Gaussian is placed at (row=x, col=y), i.e. the targets are the transposed heatmaps "
          "and the peak sits at the landmark's mirror across the diagonal.",
      cause_pattern=r"meshgrid|indexing ?= ?.?(ij|xy)|(x|col(umn)?s?) and (y|rows?).{0,30}swap"
                    r"|swap\w*.{0,40}\b(x|col(umn)?)\b.{0,10}\b(y|row)\b|transpos\w*.{0,40}heatmap"
                    r"|heatmap.{0,80}(transpos|\[x, ?y\]|rows? and col)|\(x, ?y\).{0,40}swap"
                    r"|swap\w*.{0,40}rows? and col")
def bolt_heatmaps(fixed=False):
    seed(0)
    model = _fcn(1, 2, width=24)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(BoltPlates(800, 19, fixed), 16),
                val_loader=loader(BoltPlates(200, 20, fixed), 50, shuffle=False),
                loss_fn=heatmap_loss, max_steps=300)


def keypoint_pck(model, kw):
    """Share of landmarks found: heatmap peak of at least 0.5 within 1.5 px of the true landmark."""
    ds = kw["val_loader"].dataset
    out = on_truth(model, ds.images, lambda m, x: m(x).flatten(2))
    value, peak = out.max(-1)                                              # flat index = y * 16 + x
    pred = torch.stack([peak % 16, peak // 16], -1).float()
    hit = ((pred - ds.coords).norm(dim=-1) <= 1.5) & (value >= 0.5)
    return hit.float().mean().item()


fix("bolt_heatmap_meshgrid_ij", fixed_of(bolt_heatmaps), keypoint_pck, "val PCK (peak >= 0.5 within 1.5 px)")
