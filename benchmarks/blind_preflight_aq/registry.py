"""Set aq's case registry: set a's Case / CaseTable and data helpers, its own case table, the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved), and the synthetic detection /
dense-prediction / CTC data the cases share."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_aq")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


# ---------------------------------------------------------------- boxes: one bright rectangle per 16x16 image
def box_data(n: int, s: int = 0, size: int = 16):
    """Images (n, 1, size, size) with one bright rectangle on noise; boxes (n, 4) as x1, y1, x2, y2 in [0, 1]."""
    g = gen(s)
    x = 0.3 * torch.randn(n, 1, size, size, generator=g)
    w = torch.randint(3, 9, (n,), generator=g)
    h = torch.randint(3, 9, (n,), generator=g)
    x1 = (torch.rand(n, generator=g) * (size - w + 1)).long()
    y1 = (torch.rand(n, generator=g) * (size - h + 1)).long()
    for i in range(n):
        x[i, 0, y1[i]:y1[i] + h[i], x1[i]:x1[i] + w[i]] += 2.0
    boxes = torch.stack([x1, y1, x1 + w, y1 + h], 1).float() / size
    return x, boxes


class BoxNet(nn.Module):
    def __init__(self, out: int = 4):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                      nn.Linear(32 * 16, 64), nn.ReLU())
        self.head = nn.Linear(64, out)

    def forward(self, x):
        return self.head(self.backbone(x))


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of matching rows of two (n, 4) x1y1x2y2 tensors (a degenerate box has IoU 0)."""
    ix = (torch.minimum(a[:, 2], b[:, 2]) - torch.maximum(a[:, 0], b[:, 0])).clamp(min=0)
    iy = (torch.minimum(a[:, 3], b[:, 3]) - torch.maximum(a[:, 1], b[:, 1])).clamp(min=0)
    inter = ix * iy
    area = lambda t: (t[:, 2] - t[:, 0]).clamp(min=0) * (t[:, 3] - t[:, 1]).clamp(min=0)  # noqa: E731
    return inter / (area(a) + area(b) - inter + 1e-7)


def giou_loss(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    iou = box_iou(p, t)
    cx = torch.maximum(p[:, 2], t[:, 2]) - torch.minimum(p[:, 0], t[:, 0])
    cy = torch.maximum(p[:, 3], t[:, 3]) - torch.minimum(p[:, 1], t[:, 1])
    hull = cx.clamp(min=0) * cy.clamp(min=0) + 1e-7
    ix = (torch.minimum(p[:, 2], t[:, 2]) - torch.maximum(p[:, 0], t[:, 0])).clamp(min=0)
    iy = (torch.minimum(p[:, 3], t[:, 3]) - torch.maximum(p[:, 1], t[:, 1])).clamp(min=0)
    area = lambda b: (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)  # noqa: E731
    union = area(p) + area(t) - ix * iy + 1e-7
    return (1 - (iou - (hull - union) / hull)).mean()


def box_metric(fwd=None):
    """Validation mean IoU; fwd(model, batch) -> (predicted x1y1x2y2, true x1y1x2y2)."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b) if fwd else (m(b[0]), b[-1])
            return box_iou(p.float(), y.float()).sum().item(), len(y)
        return mean_over(model, kw["val_loader"], fn)
    return metric


# ---------------------------------------------------------------- segmentation: colour-coded blobs, 3 classes
def seg_data(n: int, s: int = 0, size: int = 16):
    """Images (n, 3, size, size) and masks (n, size, size) in {0, 1, 2}: class 1 squares bright in channel 0,
    class 2 squares bright in channel 1, background noise."""
    g = gen(s)
    x = 0.5 * torch.randn(n, 3, size, size, generator=g)
    m = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        for c in (1, 2):
            w, h = (int(v) for v in torch.randint(3, 8, (2,), generator=g))
            x0, y0 = (int(v) for v in torch.randint(0, size - 7, (2,), generator=g))
            m[i, y0:y0 + h, x0:x0 + w] = c
    for c in (1, 2):
        x[:, c - 1] += 2.0 * (m == c).float()
    return x, m


class SegNet(nn.Module):
    def __init__(self, cin: int = 3, classes: int = 3, width: int = 16):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(cin, width, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x):
        return self.head(self.backbone(x))


def seg_metric(fwd=None):
    """Validation pixel accuracy; fwd(model, batch) -> (logits (N, C, H, W), masks (N, H, W))."""
    def metric(model, kw):
        def fn(m, b):
            logits, y = fwd(m, b) if fwd else (m(b[0]), b[-1])
            return (logits.argmax(1) == y).sum().item(), y.numel()
        return mean_over(model, kw["val_loader"], fn)
    return metric


# ---------------------------------------------------------------- keypoints: one blob, Gaussian heatmap target
def heatmap(kx: torch.Tensor, ky: torch.Tensor, size: int = 16, sigma: float = 1.5) -> torch.Tensor:
    ys, xs = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    return torch.exp(-((xs - kx.view(-1, 1, 1).float()) ** 2 + (ys - ky.view(-1, 1, 1).float()) ** 2)
                     / (2 * sigma ** 2)).unsqueeze(1)


def kp_data(n: int, s: int = 0, size: int = 16):
    """Images (n, 1, size, size) with one blob and a distractor stripe; keypoints (n, 2) as integer x, y."""
    g = gen(s)
    kx = torch.randint(2, size - 2, (n,), generator=g)
    ky = torch.randint(2, size - 2, (n,), generator=g)
    x = 0.3 * torch.randn(n, 1, size, size, generator=g) + 2.0 * heatmap(kx, ky, size, 1.0)
    return x, torch.stack([kx, ky], 1)


class KpNet(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(width, 1, 1)

    def forward(self, x):
        return self.head(self.backbone(x))


def kp_metric(fwd=None):
    """Validation PCK: share of images whose heatmap argmax lies within 1 pixel (Chebyshev) of the keypoint."""
    def metric(model, kw):
        def fn(m, b):
            hm, kp = fwd(m, b) if fwd else (m(b[0]), b[-1])
            w = hm.shape[-1]
            idx = hm.flatten(1).argmax(1)
            px, py = idx % w, idx // w
            ok = ((px - kp[:, 0]).abs() <= 1) & ((py - kp[:, 1]).abs() <= 1)
            return ok.sum().item(), len(kp)
        return mean_over(model, kw["val_loader"], fn)
    return metric


# ---------------------------------------------------------------- depth: per-pixel depth from local shading
def depth_data(n: int, s: int = 0, size: int = 16):
    """Images (n, 1, size, size); depth (n, size, size) in metres, about 1-5, a smooth function of a blurred
    image."""
    g = gen(s)
    x = torch.randn(n, 1, size, size, generator=g)
    blur = F.avg_pool2d(x, 3, 1, 1)
    depth = 3.0 + 2.0 * torch.tanh(2.0 * blur[:, 0])
    return x, depth


class DepthNet(nn.Module):
    def __init__(self, width: int = 16, act: nn.Module | None = None):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(width, 1, 1)
        self.act = act or nn.Identity()

    def forward(self, x):
        return self.act(self.head(self.backbone(x)))


def rmse_metric(fwd=None):
    """Validation RMSE; fwd(model, batch) -> (predictions, targets) of the same numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b) if fwd else (m(b[0]), b[-1])
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


# ---------------------------------------------------------------- CTC: token frames with gaps, greedy decoding
CTC_T, CTC_F, CTC_V = 24, 12, 5   # frames, feature size, characters (without the blank)


def ctc_data(n: int, s: int = 0, first_label: int = 1, frames_per_token: int = 2):
    """Features (n, T, F): each character shown for 2 frames (its embedding plus noise) then a noise gap frame,
    zero-padded to T; targets (n, 5) padded with 0, labels first_label .. first_label + V - 1; input and target
    lengths."""
    g = gen(s)
    emb = 1.5 * torch.randn(CTC_V, CTC_F, generator=gen(99))
    feats = torch.zeros(n, CTC_T, CTC_F)
    targets = torch.zeros(n, 5, dtype=torch.long)
    tlen = torch.randint(3, 6, (n,), generator=g)
    ilen = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        chars = torch.randint(0, CTC_V, (int(tlen[i]),), generator=g)
        t = 0
        for c in chars:
            feats[i, t:t + frames_per_token] = emb[c]
            t += frames_per_token + 1
        ilen[i] = t
        targets[i, :len(chars)] = chars + first_label
    feats[:, :, :] += 0.3 * torch.randn(n, CTC_T, CTC_F, generator=g) * (torch.arange(CTC_T) < ilen[:, None])[..., None]
    return feats, targets, ilen, tlen


def ctc_dataset(n, s=0, **kw):
    return TensorDataset(*ctc_data(n, s, **kw))


class CtcNet(nn.Module):
    """Conv1d acoustic model: (N, T, F) features -> (N, T, C) logits."""

    def __init__(self, classes: int = CTC_V + 1, width: int = 32):
        super().__init__()
        self.feature_conv = nn.Sequential(nn.Conv1d(CTC_F, width, 3, padding=1), nn.ReLU())
        self.encoder_conv = nn.Sequential(nn.Conv1d(width, width, 3, padding=1), nn.ReLU())
        self.classifier = nn.Conv1d(width, classes, 1)

    def forward(self, x):
        return self.classifier(self.encoder_conv(self.feature_conv(x.transpose(1, 2)))).transpose(1, 2)


def ctc_loss_fn(model, batch, blank: int = 0):
    feats, targets, ilen, tlen = batch
    lp = model(feats).log_softmax(-1).transpose(0, 1)
    return F.ctc_loss(lp.float(), targets, ilen, tlen, blank=blank, zero_infinity=True)


def edit_distance(a: list, b: list) -> int:
    d = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, y in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
    return d[-1]


def greedy(logits_row: torch.Tensor, length: int, blank: int) -> list:
    out, last = [], None
    for k in logits_row[:length].argmax(-1).tolist():
        if k != last and k != blank:
            out.append(k)
        last = k
    return out


def ctc_metric(fwd=None, blank: int = 0):
    """Validation 1 - CER (greedy decoding, clamped at 0); fwd(model, batch) -> (N, T, C) logits."""
    def metric(model, kw):
        def fn(m, b):
            feats, targets, ilen, tlen = b
            logits = fwd(m, b) if fwd else m(feats)
            score = 0.0
            for i in range(len(feats)):
                ref = targets[i, :tlen[i]].tolist()
                score += max(0.0, 1 - edit_distance(greedy(logits[i], int(ilen[i]), blank), ref) / len(ref))
            return score, len(feats)
        return mean_over(model, kw["val_loader"], fn)
    return metric
