"""Set aa, family targets: what the model is asked to predict is not what the user meant (masks, keypoints, boxes,
window labels), with inputs and shapes that look right."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_aa.cases_shapes import TinyFCN
from benchmarks.blind_preflight_aa.registry import (
    balanced_pixel_acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rect_scenes,
    rmse_of,
    seed,
)


def to_tensor(pic: np.ndarray) -> torch.Tensor:
    """What torchvision.transforms.ToTensor does to a uint8 HxW(xC) array: CxHxW float32 scaled to [0, 1]."""
    t = torch.from_numpy(np.ascontiguousarray(pic))
    if t.ndim == 2:
        t = t[:, :, None]
    t = t.permute(2, 0, 1).contiguous()
    return t.float().div(255) if t.dtype == torch.uint8 else t.float()


# ------------------------------------------------------------------------------------------------------------------
# 6. Segmentation masks (PNG class ids 0..2) put through ToTensor: /255, then .long() -> every pixel background.
# ------------------------------------------------------------------------------------------------------------------

class TileDataset(Dataset):
    """Tiles and masks as the PNG loader returns them: uint8 HxWx3 images, uint8 HxW masks of class ids."""

    def __init__(self, images: np.ndarray, masks: np.ndarray, raw_mask: bool = False):
        self.images, self.masks, self.raw_mask = images, masks, raw_mask

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        img = (to_tensor(self.images[i]) - 0.5) / 0.25
        if self.raw_mask:
            mask = torch.from_numpy(self.masks[i].astype(np.int64))
        else:
            mask = to_tensor(self.masks[i]).squeeze(0).long()    # same transform as the image
        return img, mask


def as_png(x: torch.Tensor, m: torch.Tensor):
    img = ((x.clamp(-2, 3) + 2) / 5 * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return img, m.to(torch.uint8).numpy()


@case("mask_totensor_scaled", "targets",
      bug="The dataset runs the uint8 class-id masks (values 0, 1, 2) through the same ToTensor transform as the "
          "images, which divides by 255; .long() then truncates 1/255 and 2/255 to 0, so every target pixel is "
          "background and the network learns to predict class 0 everywhere.",
      cause_pattern=r"ToTensor|to_tensor|/ ?255|divid\w* by 255|scal\w* (the )?masks?|masks?.{0,60}(scaled|\[0, ?1\])"
                    r"|(targets?|labels?|masks?).{0,60}(all|only|every\w*) (zero|0|background|class 0)"
                    r"|(only|single|one) (class|label) (present|in the targets)|PILToTensor|pil_to_tensor")
def mask_totensor_scaled(fixed: bool = False):
    seed(0)
    x, m = rect_scenes(768, s=21)
    img, masks = as_png(x, m)
    model = TinyFCN(3)
    train = TileDataset(img[:640], masks[:640], raw_mask=fixed)
    val_x = torch.stack([TileDataset(img[640:], masks[640:], True)[i][0] for i in range(128)])
    val = TensorDataset(val_x, m[640:])                    # validation tiles: the annotation tool's export
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("mask_totensor_scaled", fixed_of(mask_totensor_scaled),
    balanced_pixel_acc_of(lambda m, b: (m(b[0]).argmax(1), b[1]), 3), "val balanced pixel acc")


# ------------------------------------------------------------------------------------------------------------------
# 7. Landmarks with horizontal-flip augmentation: x mirrored, but left/right landmark ids not swapped.
# ------------------------------------------------------------------------------------------------------------------

def eye_images(n: int, size: int = 16, s: int = 0):
    """Two identical 'eyes' (2x2 dots) per face crop; landmark 0 is the left eye (smaller x), 1 the right eye.
    Targets (n, 4) = (x_left, y_left, x_right, y_right) in pixels."""
    g = gen(s)
    img = 0.3 * torch.randn(n, 1, size, size, generator=g)
    kp = torch.zeros(n, 4)
    for i in range(n):
        xl = int(torch.randint(1, size // 2 - 3, (1,), generator=g))
        xr = int(torch.randint(size // 2 + 1, size - 3, (1,), generator=g))
        yl, yr = torch.randint(2, size - 3, (2,), generator=g).tolist()
        img[i, 0, yl:yl + 2, xl:xl + 2] += 2.0
        img[i, 0, yr:yr + 2, xr:xr + 2] += 2.0
        kp[i] = torch.tensor([xl + 0.5, yl + 0.5, xr + 0.5, yr + 0.5])
    return img, kp


class LandmarkDataset(Dataset):
    def __init__(self, img, kp, train: bool, swap_on_flip: bool = False, size: int = 16):
        self.img, self.kp, self.train, self.swap, self.size = img, kp, train, swap_on_flip, size

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        img, kp = self.img[i], self.kp[i].clone()
        if self.train and torch.rand(1).item() < 0.5:          # RandomHorizontalFlip
            img = img.flip(-1)
            kp[0::2] = self.size - 1 - kp[0::2]                 # mirror the x coordinates
            if self.swap:
                kp = kp[[2, 3, 0, 1]]                           # the left eye is now the other one
        return img, kp


class LandmarkNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 16, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return self.head(self.features(x))


@case("keypoint_flip_no_swap", "targets",
      bug="The landmark dataset's random horizontal flip mirrors the x coordinates but keeps the landmark order, so "
          "after a flip 'left eye' (landmark 0) is the eye on the right: half the targets contradict the other half "
          "and the regressor can only predict the midpoint between the eyes.",
      cause_pattern=r"(swap|reorder|permut|exchang)\w* (the )?(left|right|l/r|symmetric|paired|landmark|keypoint)"
                    r"|(left|right)[- /](and[- ])?(left|right) (keypoint|landmark|joint|eye)s?.{0,40}(swap|ids?\b|indices|order)"
                    r"|flip_(pairs|idx|index|perm\w*)|label_mapping"
                    r"|(flip|mirror)\w*.{0,80}(keypoint|landmark)s?.{0,60}(order|identit|semantic|ids?\b|indices)"
                    r"|(keypoint|landmark)s?.{0,60}(order|identit|ids?\b|indices).{0,60}(flip|mirror)")
def keypoint_flip_no_swap(fixed: bool = False):
    seed(0)
    img, kp = eye_images(768, s=22)
    model = LandmarkNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(LandmarkDataset(img[:640], kp[:640], True, swap_on_flip=fixed), 32),
                val_loader=loader(LandmarkDataset(img[640:], kp[640:], False), 128, shuffle=False),
                loss_fn=nn.SmoothL1Loss(), max_steps=2000)


fix("keypoint_flip_no_swap", fixed_of(keypoint_flip_no_swap),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val landmark RMSE (px)", higher=False)


# ------------------------------------------------------------------------------------------------------------------
# 8. Box regression head ending in nn.Sigmoid() (from a tutorial with normalised boxes) trained on pixel boxes.
# ------------------------------------------------------------------------------------------------------------------

def box_images(n: int, size: int = 24, s: int = 0):
    g = gen(s)
    img = 0.3 * torch.randn(n, 1, size, size, generator=g)
    boxes = torch.zeros(n, 4)
    for i in range(n):
        h, w = torch.randint(4, 12, (2,), generator=g).tolist()
        top = int(torch.randint(0, size - h + 1, (1,), generator=g))
        left = int(torch.randint(0, size - w + 1, (1,), generator=g))
        img[i, 0, top:top + h, left:left + w] += 1.5
        boxes[i] = torch.tensor([left + w / 2, top + h / 2, w, h])    # (cx, cy, w, h) in pixels
    return img, boxes


class BoxDataset(Dataset):
    def __init__(self, img, boxes, scale: float = 1.0):
        self.img, self.boxes, self.scale = img, boxes, scale

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        return self.img[i], self.boxes[i] / self.scale


@case("sigmoid_head_pixel_targets", "targets",
      bug="The box head ends in nn.Sigmoid() (copied from a tutorial whose boxes were normalised to [0, 1]) but the "
          "targets are (cx, cy, w, h) in pixels, 2 to 22: the outputs can never exceed 1, saturate at 1 and the "
          "sigmoid's gradient vanishes.",
      cause_pattern=r"sigmoid.{0,120}(pixel|\[0, ?1\]|range|normali[sz]|scale|saturat|exceed|bounded)"
                    r"|(pixel|range|normali[sz]|scale).{0,120}sigmoid"
                    r"|targets? (are |lie )?(outside|beyond|out of) (the )?(output|activation)('s)? range"
                    r"|(divide|normali[sz]e) (the )?(boxes|targets|coordinates) by (the )?(image )?(size|width)")
def sigmoid_head_pixel_targets(fixed: bool = False):
    seed(0)
    size = 24
    img, boxes = box_images(768, size, s=23)
    scale = float(size) if fixed else 1.0
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 36, 64), nn.ReLU(), nn.Linear(64, 4), nn.Sigmoid())
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(BoxDataset(img[:640], boxes[:640], scale), 32),
                val_loader=loader(BoxDataset(img[640:], boxes[640:], scale), 128, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=2000)


def _box_rmse_px(model, kw):
    scale = kw["val_loader"].dataset.scale
    return rmse_of(lambda m, b: (m(b[0]) * scale, b[1] * scale))(model, kw)


fix("sigmoid_head_pixel_targets", fixed_of(sigmoid_head_pixel_targets), _box_rmse_px, "val box RMSE (px)",
    higher=False)


# ------------------------------------------------------------------------------------------------------------------
# 9. Activity recognition windows: the label of window i is labels[i], not the label at the window's position.
# ------------------------------------------------------------------------------------------------------------------

def activity_recording(length: int, s: int = 0):
    """(length, 3) accelerometer stream with activity segments of 150-400 samples; per-sample labels (4)."""
    g = gen(s)
    labels = torch.zeros(length, dtype=torch.long)
    pos = 0
    while pos < length:
        seg = int(torch.randint(150, 400, (1,), generator=g))
        labels[pos:pos + seg] = int(torch.randint(0, 4, (1,), generator=g))
        pos += seg
    t = torch.arange(length).float()
    freq = (labels.float() + 1) / 14
    amp = torch.tensor([0.6, 1.0, 1.4, 0.8])[labels]
    x = 0.4 * torch.randn(length, 3, generator=g)
    x[:, 0] += amp * torch.sin(2 * np.pi * freq * t)
    x[:, 1] += 0.5 * amp * torch.cos(2 * np.pi * freq * t)
    x[:, 2] += (labels == 3).float() * 0.8
    return x, labels


class SlidingWindows(Dataset):
    def __init__(self, signal, labels, window: int = 32, stride: int = 16, label_at_window: bool = False):
        self.signal, self.labels, self.window, self.stride = signal, labels, window, stride
        self.label_at_window = label_at_window

    def __len__(self):
        return (len(self.signal) - self.window) // self.stride + 1

    def __getitem__(self, i):
        start = i * self.stride
        x = self.signal[start:start + self.window].T            # (3, window)
        y = self.labels[start + self.window // 2] if self.label_at_window else self.labels[i]
        return x, y


class WindowCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(3, 32, 5, padding=2), nn.ReLU(), nn.Conv1d(32, 32, 5, padding=2),
                                 nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


@case("window_label_index", "targets",
      bug="The sliding-window dataset (window 32, stride 16) labels window i with labels[i], the label of sample i, "
          "instead of the label at the window's own position (labels[i * stride + window // 2]); the windows get the "
          "labels of the recording's first few hundred samples, unrelated to their content.",
      cause_pattern=r"labels?\[i\]|labels?\[i ?\* ?stride|i ?\* ?stride|window('s)? (own )?(position|start|centre|center|end)"
                    r"|(window|segment) (index|number) .{0,60}(instead of|rather than|not) .{0,30}(sample|time|position)"
                    r"|(labels?|targets?).{0,80}(misaligned|out of (sync|step)|offset|shifted) .{0,60}windows?"
                    r"|windows?.{0,80}(misaligned|out of (sync|step)) .{0,40}labels?")
def window_label_index(fixed: bool = False):
    seed(0)
    sig_a, lab_a = activity_recording(8000, s=24)
    sig_b, lab_b = activity_recording(4000, s=124)
    model = WindowCNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(SlidingWindows(sig_a, lab_a, label_at_window=fixed), 32),
                val_loader=loader(SlidingWindows(sig_b, lab_b, label_at_window=fixed), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


def _window_acc_true_labels(model, kw):
    """Accuracy against the label at each validation window's centre, whatever the dataset returns."""
    ds = kw["val_loader"].dataset
    xs = torch.stack([ds.signal[i * ds.stride:i * ds.stride + ds.window].T for i in range(len(ds))])
    ys = torch.stack([ds.labels[i * ds.stride + ds.window // 2] for i in range(len(ds))])
    batches = [(xs[j:j + 256], ys[j:j + 256]) for j in range(0, len(xs), 256)]

    def fn(m, b):
        return (m(b[0]).argmax(-1) == b[1]).sum().item(), len(b[1])
    return mean_over(model, batches, fn)


fix("window_label_index", fixed_of(window_label_index), _window_acc_true_labels, "val acc (true window labels)")


# ------------------------------------------------------------------------------------------------------------------
# 10. Masks downsampled with the image's bilinear interpolation, then .long(): rims of class 2 become class 1.
# ------------------------------------------------------------------------------------------------------------------

def small_object_scenes(n: int, size: int = 32, s: int = 0):
    """(n, 3, size, size) scenes with small class-1 and class-2 squares (2-5 px), class c brightening channel c - 1."""
    g = gen(s)
    masks = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        for _ in range(6):
            c = int(torch.randint(1, 3, (1,), generator=g))
            h, w = torch.randint(2, 6, (2,), generator=g).tolist()
            top = int(torch.randint(0, size - h + 1, (1,), generator=g))
            left = int(torch.randint(0, size - w + 1, (1,), generator=g))
            masks[i, top:top + h, left:left + w] = c
    img = 0.6 * torch.randn(n, 3, size, size, generator=g)
    for c in (1, 2):
        img[:, c - 1] += 1.5 * (masks == c).float()
    return img, masks


class HalfResTiles(Dataset):
    """Tiles come at 32x32; the network trains at 16x16, so image and mask are resized in __getitem__."""

    def __init__(self, img, masks, nearest_mask: bool = False):
        self.img, self.masks, self.nearest = img, masks, nearest_mask

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        img = F.interpolate(self.img[i][None], size=(16, 16), mode="bilinear", align_corners=False)[0]
        m = self.masks[i][None, None].float()
        if self.nearest:
            m = F.interpolate(m, size=(16, 16), mode="nearest")
        else:
            m = F.interpolate(m, size=(16, 16), mode="bilinear", align_corners=False)
        return img, m[0, 0].long()


@case("mask_bilinear_resize", "targets",
      bug="The dataset downsamples the class-id masks with the same bilinear F.interpolate as the images and then "
          "casts with .long(): pixels on object borders get averaged ids (a 2 next to a 0 becomes 1.0, 2 next to 1 "
          "becomes 1.5 -> 1), so the small class-2 objects are mostly labelled class 1 or background.",
      cause_pattern=r"bilinear|mode ?= ?['\"]?nearest|nearest[- ]neighbou?r|interpolat\w* (the )?(masks?|labels?|targets?)"
                    r"|(masks?|labels?|targets?) .{0,40}(interpolat|resiz|resampl)\w*"
                    r"|(averaged|fractional|non-integer|in-between) (class )?(ids?|labels?|values)")
def mask_bilinear_resize(fixed: bool = False):
    seed(0)
    x, m = small_object_scenes(768, s=25)
    model = TinyFCN(3)
    val = HalfResTiles(x[640:], m[640:], nearest_mask=True)
    val_xy = [val[i] for i in range(len(val))]
    val_ds = TensorDataset(torch.stack([a for a, _ in val_xy]), torch.stack([b for _, b in val_xy]))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(HalfResTiles(x[:640], m[:640], nearest_mask=fixed), 32),
                val_loader=loader(val_ds, 64, shuffle=False),     # validation masks: the nearest-resized export
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("mask_bilinear_resize", fixed_of(mask_bilinear_resize),
    balanced_pixel_acc_of(lambda m, b: (m(b[0]).argmax(1), b[1]), 3), "val balanced pixel acc")
