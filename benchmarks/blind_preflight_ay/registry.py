"""Set ay's case registry: set a's Case / CaseTable and data helpers, its own case table, the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved), and the synthetic image helpers
(uint8 HWC images as PIL / NumPy / OpenCV would give them, small CNNs built in code)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_ay")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix

H = W = 16
COLOURS = np.array([[220, 40, 40], [40, 220, 40], [40, 40, 220], [220, 210, 40]], dtype=np.float32)  # R G B Y


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rmse_of(fwd=None):
    """Validation RMSE with fwd(model, batch) -> (predictions, targets) of any matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b) if fwd else (m(b[0]), b[-1])
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


def acc_of(fwd):
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            return (p == y).sum().item(), y.numel()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def colour_blobs(n: int, s: int = 0, classes: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """uint8 HWC RGB images (n, 16, 16, 3): a grey noisy background with one 6x6 blob whose colour is the class."""
    rng = np.random.default_rng(s)
    y = rng.integers(0, classes, n)
    img = rng.normal(110, 25, (n, H, W, 3))
    for i in range(n):
        r, c = rng.integers(0, H - 6, 2)
        img[i, r:r + 6, c:c + 6] = COLOURS[y[i]] + rng.normal(0, 15, (6, 6, 3))
    return np.clip(img, 0, 255).astype(np.uint8), y.astype(np.int64)


def arrows(n: int, s: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """uint8 HWC images of a horizontal bar with a brightness ramp: class 0 ramps left->right, 1 right->left,
    class 2 a vertical bar ramping top->bottom, class 3 bottom->top (orientation-dependent labels)."""
    rng = np.random.default_rng(s)
    y = rng.integers(0, 4, n)
    img = rng.normal(40, 15, (n, H, W, 3))
    ramp = np.linspace(60, 250, 10)
    for i in range(n):
        a, b = rng.integers(1, 5), rng.integers(1, 6)  # placement symmetric under a mirror
        r = ramp if y[i] % 2 == 0 else ramp[::-1]
        if y[i] < 2:
            img[i, 5 + a:8 + a, b:b + 10] = r[None, :, None]
        else:
            img[i, b:b + 10, 5 + a:8 + a] = r[:, None, None]
    return np.clip(img + rng.normal(0, 10, img.shape), 0, 255).astype(np.uint8), y.astype(np.int64)


def dots(n: int, s: int = 0, max_count: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """uint8 HWC images with 0..max_count bright 2x2 dots; the target is the count (float)."""
    rng = np.random.default_rng(s)
    y = rng.integers(0, max_count + 1, n)
    img = rng.normal(30, 10, (n, H, W, 3))
    for i in range(n):
        cells = rng.choice(64, y[i], replace=False)
        for cell in cells:
            r, c = divmod(int(cell), 8)
            img[i, 2 * r:2 * r + 2, 2 * c:2 * c + 2] = 230
    return np.clip(img, 0, 255).astype(np.uint8), y.astype(np.float32)


def to_chw(img: np.ndarray) -> torch.Tensor:
    """The right conversion: uint8 HWC -> float NCHW in [0, 1]."""
    return torch.from_numpy(img).permute(0, 3, 1, 2).float().div(255)


class SmallCNN(nn.Module):
    def __init__(self, out: int = 4, bn: bool = True, width: int = 16, cin: int = 3):
        super().__init__()
        norm = (lambda c: nn.BatchNorm2d(c)) if bn else (lambda c: nn.Identity())
        self.features = nn.Sequential(
            nn.Conv2d(cin, width, 3, padding=1), norm(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), norm(2 * width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1), norm(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(2 * width, out)

    def forward(self, x):
        return self.fc(self.features(x))


class Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))


class TinyResNet(nn.Module):
    """A ResNet-style backbone built in code: stem, two residual stages, pooled features; ``fc`` the head."""

    def __init__(self, out: int = 4, width: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layer1 = Block(width)
        self.down = nn.Sequential(nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(2 * width), nn.ReLU())
        self.layer2 = Block(2 * width)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, out)

    def features(self, x):
        return self.pool(self.layer2(self.down(self.layer1(self.stem(x))))).flatten(1)

    def forward(self, x):
        return self.fc(self.features(x))


def tensor_loaders(x_tr, y_tr, x_va, y_va, batch_size: int = 32):
    from torch.utils.data import TensorDataset
    return loader(TensorDataset(x_tr, y_tr), batch_size), loader(TensorDataset(x_va, y_va), 128, shuffle=False)


def val_nll(model, kw) -> float:
    """Validation cross-entropy (NLL of the true class) of a classifier called as model(x)."""
    import torch.nn.functional as F

    def fn(m, b):
        return F.cross_entropy(m(b[0]).float(), b[-1], reduction="sum").item(), b[-1].numel()
    return mean_over(model, kw["val_loader"], fn)
