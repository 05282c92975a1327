"""Set t, family data: the pipeline hands the model something other than what the user built (augmentations that
break the image/target link, a Dataset that returns one sample, boxes left in the old pixel frame, class indices
that differ between two folders)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, TensorDataset

from benchmarks.blind_preflight_t.cases_shapes import colour_blobs, rect_scenes, small_fcn
from benchmarks.blind_preflight_t.registry import (
    acc_on,
    case,
    dev,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_on,
    seed,
    val_batches,
)


class RandomHFlip:
    """torchvision.transforms.RandomHorizontalFlip: flips the last axis with probability p, a fresh draw per call."""

    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t.flip(-1) if torch.rand(1) < self.p else t


def pixel_fwd(m, b):
    return m(b[0].to(dev(m))).argmax(1), b[1].to(dev(m))


def cls_fwd(m, b):
    return m(b[0].to(dev(m))).argmax(-1), b[-1].to(dev(m))

# --------------------------------------------------------------------------------------------------------------------
# Segmentation augmentation: the random flip is called once for the image and once for the mask.


class AugmentedTiles(Dataset):
    def __init__(self, images, masks, fixed: bool):
        self.images, self.masks, self.fixed = images, masks, fixed
        self.transform = RandomHFlip(0.5)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image, mask = self.images[i], self.masks[i]
        if self.fixed:
            both = self.transform(torch.cat([image, mask[None].float()]))  # one draw for image and mask
            image, mask = both[:1], both[1].long()
        else:
            image, mask = self.transform(image), self.transform(mask)
        return image, mask


@case("seg_flip_drawn_separately_for_mask", "data",
      bug="The segmentation Dataset applies its RandomHorizontalFlip transform to the image and then, in a second "
          "call, to the mask: each call draws its own coin, so in half of the training samples the mask is mirrored "
          "relative to the image and the labels no longer sit on the objects.",
      cause_pattern=r"(image|input)s? and (the )?(mask|target|label)s? .*(different|separate|independent|same) "
                    r"(random|draw|transform|flip|augment)|(separate|independent|two) (random )?(draws|calls|coins?)|"
                    r"(mask|target|label)s? (is |are )?(not )?(flipped|augmented|transformed) "
                    r"(independently|separately|differently)|misalign\w*|(same|shared|joint|paired) "
                    r"(random )?(flip|transform|augmentation|parameters|seed)|mirrored relative")
def seg_flip_drawn_separately_for_mask(fixed: bool = False) -> dict:
    seed(0)
    x, y = rect_scenes(1200, 16, gen(41))
    model = small_fcn(4)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(AugmentedTiles(x[:1000], y[:1000], fixed), 16),
                val_loader=loader(TensorDataset(x[1000:], y[1000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("seg_flip_drawn_separately_for_mask", fixed_of(seg_flip_drawn_separately_for_mask), acc_on(val_batches, pixel_fwd),
    "val pixel accuracy", steps=200)

# --------------------------------------------------------------------------------------------------------------------
# Eye keypoints: horizontal flip mirrors x but does not swap the left-eye and right-eye targets.


def eye_tiles(n: int, g: torch.Generator):
    """Two identical spots (left eye x in [2, 6], right eye x in [9, 13]); target (lx, ly, rx, ry) in pixels."""
    lx = 2 + 4 * torch.rand(n, generator=g)
    rx = 9 + 4 * torch.rand(n, generator=g)
    ly = 3 + 10 * torch.rand(n, generator=g)
    ry = ly + torch.randn(n, generator=g)
    ys, xs = torch.meshgrid(torch.arange(16).float(), torch.arange(16).float(), indexing="ij")

    def spot(cx, cy):
        return torch.exp(-((xs - cx[:, None, None]) ** 2 + (ys - cy[:, None, None]) ** 2) / 2.0)

    img = (spot(lx, ly) + spot(rx, ry))[:, None] + 0.2 * torch.randn(n, 1, 16, 16, generator=g)
    return img, torch.stack([lx, ly, rx, ry], 1)


class FlippedEyes(Dataset):
    def __init__(self, images, points, fixed: bool, augment: bool = True):
        self.images, self.points, self.fixed, self.augment = images, points, fixed, augment

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image, (lx, ly, rx, ry) = self.images[i], self.points[i].tolist()
        if self.augment and torch.rand(1) < 0.5:
            image = image.flip(-1)
            lx, rx = 15 - lx, 15 - rx
            if self.fixed:
                (lx, ly), (rx, ry) = (rx, ry), (lx, ly)  # the left eye is now the one on the left
        return image, torch.tensor([lx, ly, rx, ry]) / 16


def eye_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, padding=1),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 4))


@case("eye_keypoints_flip_without_left_right_swap", "data",
      bug="The keypoint Dataset's horizontal-flip augmentation mirrors the x coordinates (x -> 15 - x) but does not "
          "swap the left-eye and right-eye targets, so after a flip the 'left eye' target sits on the right-hand "
          "spot: the two targets contradict each other and the model regresses both eyes toward the middle.",
      cause_pattern=r"swap\w*|left[/ -]right|(left|right)[- ](and|&|/)[- ](right|left)|symmetr\w* "
                    r"(keypoints?|pairs?|parts)|flip_pairs|matched_parts|(flip|mirror)\w* .*(keypoint|landmark|"
                    r"eye)s? .*(label|identit|order|index)|(keypoint|landmark)s? (identit|order|label)\w* .*flip")
def eye_keypoints_flip_without_left_right_swap(fixed: bool = False) -> dict:
    seed(0)
    img, pts = eye_tiles(1500, gen(42))
    model = eye_net()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(FlippedEyes(img[:1200], pts[:1200], fixed), 32),
                val_loader=loader(FlippedEyes(img[1200:], pts[1200:], fixed, augment=False), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


def reg_fwd(m, b):
    d = dev(m)
    return m(b[0].to(d)), b[1].to(d)


fix("eye_keypoints_flip_without_left_right_swap", fixed_of(eye_keypoints_flip_without_left_right_swap),
    rmse_on(val_batches, reg_fwd), "val keypoint RMSE (fraction of the tile)", steps=300, higher=False)

# --------------------------------------------------------------------------------------------------------------------
# A procedural Dataset that re-seeds its generator with the same seed in every __getitem__ call.


def render_shape(rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """A circle, a square or a cross (the label) at a random place on a 16x16 noisy tile."""
    label = int(rng.integers(0, 3))
    cy, cx = rng.integers(4, 12, size=2)
    ys, xs = np.mgrid[0:16, 0:16]
    if label == 0:
        shape = ((ys - cy) ** 2 + (xs - cx) ** 2 <= 9).astype(np.float32)
    elif label == 1:
        shape = ((abs(ys - cy) <= 2) & (abs(xs - cx) <= 2)).astype(np.float32)
    else:
        shape = (((abs(ys - cy) <= 3) & (abs(xs - cx) <= 0)) | ((abs(xs - cx) <= 3) & (abs(ys - cy) <= 0)))
        shape = shape.astype(np.float32)
    return shape + 0.3 * rng.standard_normal((16, 16)).astype(np.float32), label


class ShapesOnTheFly(Dataset):
    """Renders sample idx on the fly; seeded so that every epoch sees the same images."""

    def __init__(self, n: int, seed: int, fixed: bool):
        self.n, self.seed, self.fixed = n, seed, fixed

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        rng = np.random.default_rng(self.seed + idx if self.fixed else self.seed)
        image, label = render_shape(rng)
        return torch.from_numpy(image)[None], label


def shape_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(32, 3))


@case("procedural_dataset_reseeded_every_item", "data",
      bug="The procedural Dataset creates np.random.default_rng(self.seed) inside __getitem__ with the same seed for "
          "every index, so every sample it returns is the same image with the same label: the model is trained on "
          "one example repeated 1200 times.",
      cause_pattern=r"default_rng|(same|fixed|constant) seed|re-?seed\w*|(every|all|each) (sample|item|image|example)s? "
                    r"(is|are) (the same|identical)|identical (samples|items|images|examples)|(same|one) "
                    r"(sample|image|example) (repeated|every)|ignores? (the )?(idx|index)|"
                    r"__getitem__ .{0,60}(same|identical|seed)")
def procedural_dataset_reseeded_every_item(fixed: bool = False) -> dict:
    seed(0)
    val = [render_shape(np.random.default_rng(10_000 + i)) for i in range(300)]
    val_x = torch.from_numpy(np.stack([v[0] for v in val]))[:, None]
    val_y = torch.tensor([v[1] for v in val])
    model = shape_cnn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(ShapesOnTheFly(1200, 7, fixed), 32),
                val_loader=loader(TensorDataset(val_x, val_y), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("procedural_dataset_reseeded_every_item", fixed_of(procedural_dataset_reseeded_every_item),
    acc_on(val_batches, cls_fwd), "val accuracy", steps=200)

# --------------------------------------------------------------------------------------------------------------------
# Box regression: images of many sizes resized to 32x32, box coordinates left in the original pixel frame.

SIDE = 32


def box_images(n: int, g: torch.Generator):
    sizes = torch.randint(16, 65, (n,), generator=g)
    images, boxes = [], []
    for s in sizes.tolist():
        w, h = (int(v) for v in torch.randint(s // 4, s // 2 + 1, (2,), generator=g))
        x0, y0 = int(torch.randint(0, s - w, (1,), generator=g)), int(torch.randint(0, s - h, (1,), generator=g))
        img = 0.3 * torch.randn(1, s, s, generator=g)
        img[:, y0:y0 + h, x0:x0 + w] += 1.0
        images.append(img)
        boxes.append(torch.tensor([x0, y0, x0 + w, y0 + h], dtype=torch.float32))
    return images, torch.stack(boxes), sizes


class ResizedBoxes(Dataset):
    def __init__(self, images, boxes, sizes, fixed: bool):
        self.images, self.boxes, self.sizes, self.fixed = images, boxes, sizes, fixed

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = F.interpolate(self.images[i][None], size=(SIDE, SIDE), mode="bilinear", align_corners=False)[0]
        box = self.boxes[i]
        if self.fixed:
            box = box * SIDE / self.sizes[i]
        return image, box / SIDE  # normalised to the 32x32 network input


def box_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 4))


@case("resized_images_boxes_left_in_original_pixels", "data",
      bug="Images of sizes 16-64 px are resized to 32x32 in __getitem__ but their box coordinates stay in the "
          "original image's pixels before being divided by 32, so the same normalised box gets targets between 0.5x "
          "and 2x its true value depending on a size the model cannot see.",
      cause_pattern=r"(box|bbox|coordinate|target)\w* .*(not|never) (re)?scaled|(re)?scal\w* (the )?(box|bbox|"
                    r"coordinates)|resiz\w* .*(box|bbox|coordinate)|(box|bbox|coordinate)\w* .*resiz|"
                    r"original (image )?(size|pixels|resolution|frame)|(scale|size) factor|"
                    r"(box|bbox)\w* (exceed|outside|beyond|greater than) (the )?(image|1)")
def resized_images_boxes_left_in_original_pixels(fixed: bool = False) -> dict:
    seed(0)
    images, boxes, sizes = box_images(1400, gen(44))
    model = box_net()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(ResizedBoxes(images[:1100], boxes[:1100], sizes[:1100], fixed), 32),
                val_loader=loader(ResizedBoxes(images[1100:], boxes[1100:], sizes[1100:], fixed), 100, shuffle=False),
                loss_fn=nn.SmoothL1Loss(), max_steps=250)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    lt, rb = torch.maximum(a[:, :2], b[:, :2]), torch.minimum(a[:, 2:], b[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = (a[:, 2:] - a[:, :2]).clamp(min=0).prod(-1) + (b[:, 2:] - b[:, :2]).clamp(min=0).prod(-1)
    return inter / (area - inter).clamp(min=1e-6)


def true_box_iou(model, kw):
    ds = kw["val_loader"].dataset
    truth = ResizedBoxes(ds.images, ds.boxes, ds.sizes, fixed=True)

    def fn(m, b):
        return box_iou(m(b[0].to(dev(m))), b[1].to(dev(m))).sum().item(), len(b[1])
    return mean_over(model, DataLoader(truth, batch_size=100), fn)


fix("resized_images_boxes_left_in_original_pixels", fixed_of(resized_images_boxes_left_in_original_pixels),
    true_box_iou, "val mean IoU (true boxes)", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# Two ImageFolder-style folders concatenated: the second lacks one class, so its class_to_idx is shifted.

CLASS_NAMES = ("bicycle", "bus", "car", "truck")


class FolderDataset(Dataset):
    """ImageFolder's contract on an in-memory folder tree {class_name: images}: classes are the sorted folder names
    and class_to_idx maps them to 0..n-1 (find_classes), unless class_to_idx is passed."""

    def __init__(self, root: dict, class_to_idx: dict | None = None):
        classes = sorted(name for name, imgs in root.items() if len(imgs))
        self.class_to_idx = class_to_idx or {c: i for i, c in enumerate(classes)}
        self.samples = [(img, self.class_to_idx[c]) for c in classes for img in root[c]]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def photo_folder(n: int, g: torch.Generator, skip: str | None = None) -> dict:
    x, y = colour_blobs(n, 16, g)
    return {c: ([] if c == skip else list(x[y == k])) for k, c in enumerate(CLASS_NAMES)}


class VehicleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                      nn.ReLU())
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


@case("two_folders_different_class_to_idx", "data",
      bug="The training set concatenates two ImageFolder-style datasets (two collection rounds); the second round "
          "has no 'bicycle' folder, so its find_classes maps bus/car/truck to 0/1/2 instead of 1/2/3 and more than "
          "half of the training images carry the index of a different class.",
      cause_pattern=r"class_to_idx|find_classes|(class|label) (index|indices|mapping|ids?) .*(differ|inconsistent|"
                    r"mismatch|shift)|(differ|inconsistent|mismatch\w*|shift\w*) .*(class|label) (index|indices|"
                    r"mapping|ids?)|missing (class|folder)|(folder|class) .*(missing|absent|empty)|ConcatDataset|"
                    r"(same|shared) (class )?mapping")
def two_folders_different_class_to_idx(fixed: bool = False) -> dict:
    seed(0)
    g = gen(45)
    round1 = FolderDataset(photo_folder(500, g))
    round2_tree = photo_folder(700, g, skip="bicycle")
    round2 = FolderDataset(round2_tree, class_to_idx=round1.class_to_idx) if fixed else FolderDataset(round2_tree)
    val = FolderDataset(photo_folder(400, g))
    model = VehicleNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ConcatDataset([round1, round2]), 32),
                val_loader=loader(val, 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("two_folders_different_class_to_idx", fixed_of(two_folders_different_class_to_idx), acc_on(val_batches, cls_fwd),
    "val accuracy", steps=200)
