"""Set aj, family ``shapes``: a dimension or layout slip that broadcasts, scrambles or normalises along the wrong
axis without an error."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_aj.registry import acc_of, case, fix, fixed_of, gen, loader, seed

# --------------------------------------------------------------------------------------------------------------------
# shared synthetic data

def spectrograms(n: int, s: int, n_classes: int = 4, weights=None, tone: float = 1.0):
    """Log-mel-like patches (n, 1, 16 mel bins, 20 frames): each keyword class is a tone in its own band of 4 bins,
    with a random bin inside the band and a random onset; ``weights``: class frequencies (default: balanced)."""
    g = gen(s)
    if weights is None:
        y = torch.randint(0, n_classes, (n,), generator=g)
    else:
        y = torch.multinomial(torch.tensor(weights, dtype=torch.float), n, replacement=True, generator=g)
    spec = torch.rand(n, 1, 16, 20, generator=g) * 0.6
    band = 4 * y + torch.randint(0, 4, (n,), generator=g)
    onset = torch.randint(0, 10, (n,), generator=g)
    frames = torch.arange(20)
    on = (frames[None, :] >= onset[:, None]) & (frames[None, :] < onset[:, None] + 10)
    spec[torch.arange(n), 0, band, :] += on.float() * tone
    return spec, y


class KeywordCNN(nn.Module):
    """A small keyword-spotting CNN over log-mel patches, returning log-probabilities over the classes."""

    def __init__(self, softmax_dim: int = 1, n_classes: int = 4):
        super().__init__()
        self.softmax_dim = softmax_dim
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d((4, 1)))
        self.head = nn.Linear(64, n_classes)

    def forward(self, spec):
        return F.log_softmax(self.head(self.features(spec).flatten(1)), dim=self.softmax_dim)


def box_images(n: int, s: int, size: int = 16):
    """Single-object 16x16 images (a bright rectangle on noise) and the box as (cx, cy, w, h) in [0, 1]."""
    g = gen(s)
    w = torch.randint(3, 9, (n,), generator=g)
    h = torch.randint(3, 9, (n,), generator=g)
    x0 = (torch.rand(n, generator=g) * (size - w + 1)).long()
    y0 = (torch.rand(n, generator=g) * (size - h + 1)).long()
    img = torch.rand(n, 1, size, size, generator=g) * 0.3
    cols, rows = torch.arange(size)[None, :], torch.arange(size)[None, :]
    inx = (cols >= x0[:, None]) & (cols < (x0 + w)[:, None])
    iny = (rows >= y0[:, None]) & (rows < (y0 + h)[:, None])
    img[:, 0] += (iny[:, :, None] & inx[:, None, :]).float()
    box = torch.stack([(x0 + w / 2) / size, (y0 + h / 2) / size, w / size, h / size], 1).float()
    return img, box


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of (cx, cy, w, h) boxes, row by row."""
    a1, a2 = a[:, :2] - a[:, 2:] / 2, a[:, :2] + a[:, 2:] / 2
    b1, b2 = b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2
    inter = (torch.min(a2, b2) - torch.max(a1, b1)).clamp(min=0).prod(1)
    union = a[:, 2:].prod(1) + b[:, 2:].prod(1) - inter
    return inter / union.clamp(min=1e-6)


def mean_iou(model, kw) -> float:
    was = model.training
    model.eval()
    total = n = 0.0
    with torch.no_grad():
        for x, box in kw["val_loader"]:
            pred = model(x.to(next(model.parameters()).device))
            pred = pred[1] if isinstance(pred, tuple) else pred
            total += box_iou(pred.float().cpu(), box.reshape(-1, 4)).sum().item()
            n += len(x)
    model.train(was)
    return total / n


# --------------------------------------------------------------------------------------------------------------------
# 1. keypoint heatmaps drawn with torch.meshgrid's default indexing="ij" read as (x, y): every target is transposed

def blob_images(n: int, s: int, size: int = 16):
    """One bright blob (a landmark) per 16x16 image at pixel (x, y)."""
    g = gen(s)
    x = torch.randint(1, size - 1, (n,), generator=g)
    y = torch.randint(1, size - 1, (n,), generator=g)
    img = torch.rand(n, 1, size, size, generator=g) * 0.4
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            img[torch.arange(n), 0, y + dy, x + dx] += 1.0 if dx == dy == 0 else 0.5
    return img, torch.stack([x, y], 1)


def gaussian_heatmaps(points: torch.Tensor, size: int = 16, sigma: float = 1.0, xy_indexing: bool = True):
    """Target heatmaps (n, 1, size, size) with a Gaussian at each (x, y) landmark."""
    if xy_indexing:
        xx, yy = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="xy")
    else:
        xx, yy = torch.meshgrid(torch.arange(size), torch.arange(size))   # numpy habit; torch's default is "ij"
    px, py = points[:, 0, None, None].float(), points[:, 1, None, None].float()
    return torch.exp(-((xx[None] - px) ** 2 + (yy[None] - py) ** 2) / (2 * sigma ** 2))[:, None]


class HeatmapFCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                 nn.ReLU(), nn.Conv2d(16, 1, 1))

    def forward(self, img):
        return self.net(img)


def landmark_error(model, kw) -> float:
    """Mean pixel distance between the argmax of the predicted heatmap, read as (x=column, y=row), and the landmark."""
    was = model.training
    model.eval()
    total = n = 0.0
    with torch.no_grad():
        for img, _ in kw["val_loader"]:
            heat = model(img.to(next(model.parameters()).device)).float().cpu().flatten(1)
            idx = heat.argmax(1)
            pred = torch.stack([idx % 16, idx // 16], 1).float()
            total += (pred - _VAL_POINTS[int(n):int(n) + len(img)].float()).norm(dim=1).sum().item()
            n += len(img)
    model.train(was)
    return total / n


_IMG, _POINTS = blob_images(1300, 1)
_VAL_POINTS = _POINTS[1000:]


@case("aj_heatmap_meshgrid_ij", "shapes",
      bug="The landmark heatmaps are drawn with xx, yy = torch.meshgrid(arange(W), arange(H)) as in numpy, but "
          "torch.meshgrid's default indexing is 'ij', so xx varies along the rows: every Gaussian target sits at "
          "(row=x, col=y), the transpose of the landmark, which a small FCN cannot map to.",
      cause_pattern=r"meshgrid|indexing\s*=?\s*['\"]?(ij|xy)|\b(x|y) and (x|y)\b.{0,20}swapped|"
                    r"(swapped|transposed)\W.{0,40}(heatmap|target|x\W{1,3}y|rows? and col)|"
                    r"(heatmap|target)s?\W.{0,60}(transposed|swapped)|\(row, ?col\).{0,40}\(x, ?y\)")
def heatmap_meshgrid_ij(fixed: bool = False):
    seed(0)
    heat = gaussian_heatmaps(_POINTS, xy_indexing=fixed)
    model = HeatmapFCN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(_IMG[:1000], heat[:1000]), 32),
                val_loader=loader(TensorDataset(_IMG[1000:], heat[1000:]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=600)


fix("aj_heatmap_meshgrid_ij", fixed_of(heatmap_meshgrid_ij), landmark_error, "val landmark error (px)", steps=200,
    higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 2. activity recognition with a transformer encoder left at batch_first=False, fed (batch, time, channels)

def oscillation_windows(n: int, s: int, T: int = 24):
    """3-axis windows: class 1 oscillates fast on axis 0, class 0 slowly; random phase and amplitude, noisy axes."""
    g = gen(s)
    y = torch.randint(0, 2, (n,), generator=g)
    freq = torch.where(y == 1, 1.6, 0.45) * (1 + 0.15 * torch.rand(n, generator=g))
    phase = torch.rand(n, generator=g) * 2 * math.pi
    amp = 0.6 + 0.8 * torch.rand(n, 1, generator=g)
    t = torch.arange(T).float()
    x = torch.randn(n, T, 3, generator=g) * 0.3
    x[:, :, 0] += amp * torch.sin(freq[:, None] * t + phase[:, None])
    return x, y


def sinusoid_positions(T: int, d: int) -> torch.Tensor:
    pos = torch.arange(T).float()[:, None]
    i = torch.arange(0, d, 2).float()[None, :]
    pe = torch.zeros(T, d)
    pe[:, 0::2] = torch.sin(pos / 10 ** (i / d))
    pe[:, 1::2] = torch.cos(pos / 10 ** (i / d))
    return pe


class ActivityTransformer(nn.Module):
    def __init__(self, batch_first: bool, T: int = 24, d: int = 32):
        super().__init__()
        self.embed = nn.Linear(3, d)
        self.register_buffer("pos", sinusoid_positions(T, d))
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)

    def forward(self, x):                       # x: (batch, time, channels)
        h = self.encoder(self.embed(x) + self.pos)
        return self.head(h.mean(dim=1))


@case("aj_har_transformer_seq_first", "shapes",
      bug="nn.TransformerEncoderLayer is built with the default batch_first=False but fed (batch, time, channels) "
          "windows, so self-attention runs across the 32 windows of the batch at each time step instead of across "
          "the 24 time steps of a window: the encoder never relates one time step to another.",
      cause_pattern=r"(Transformer\w*|MultiheadAttention|self-attention|attention|encoder)\W.{0,80}batch_first|batch_first\W.{0,80}"
                    r"(Transformer\w*|MultiheadAttention|attention|encoder)|(seq(uence)?|time)[- ]first|\(seq(_len)?, ?batch|"
                    r"\((S|T|L), ?N, ?E\)|attend\w* (across|over) the batch|attention\W.{0,60}(across|over|along) (the )?"
                    r"(batch|samples|windows)")
def har_transformer_seq_first(fixed: bool = False):
    seed(0)
    x, y = oscillation_windows(1300, 2)
    model = ActivityTransformer(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1000], y[:1000]), 32),
                val_loader=loader(TensorDataset(x[1000:], y[1000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=900)


fix("aj_har_transformer_seq_first", fixed_of(har_transformer_seq_first),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)


# --------------------------------------------------------------------------------------------------------------------
# 3. IMU windows stored (batch, time, axes) reshaped for Conv1d with .view instead of .permute

def axis_windows(n: int, s: int, T: int = 32):
    """Which of the 3 IMU axes carries the vibration burst is the class."""
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, T, 3, generator=g) * 0.5
    t = torch.arange(T).float()
    phase = torch.rand(n, 1, generator=g) * 2 * math.pi
    x[torch.arange(n), :, y] += 1.5 * torch.sin(1.7 * t[None, :] + phase)
    return x, y


class IMUConvNet(nn.Module):
    def __init__(self, permute: bool):
        super().__init__()
        self.permute = permute
        self.net = nn.Sequential(nn.Conv1d(3, 16, 5, padding=2), nn.ReLU(), nn.Conv1d(16, 16, 5, padding=2),
                                 nn.ReLU(), nn.AdaptiveMaxPool1d(1), nn.Flatten(), nn.Linear(16, 3))

    def forward(self, x):                       # x: (batch, time, axes)
        if self.permute:
            x = x.permute(0, 2, 1)              # (batch, axes, time)
        else:
            x = x.view(x.size(0), x.size(2), x.size(1))
        return self.net(x)


@case("aj_imu_conv1d_view_not_permute", "shapes",
      bug="The IMU windows come as (batch, time=32, axes=3) and the model reshapes them for nn.Conv1d with "
          "x.view(batch, 3, 32) instead of x.permute(0, 2, 1): view keeps the memory order, so each 'channel' row "
          "holds interleaved samples of all three axes and the axis that carries the burst is lost.",
      cause_pattern=r"\bview\((batch|B|N|n|x\.size\(0\)|\w+), ?(3|C|axes|channels|x\.size\(2\))|view keeps (the )?memory order|"
                    r"\breshape\b.{0,60}(instead of|rather than).{0,20}(permute|transpose)|"
                    r"(permute|transpose)\W.{0,80}(instead of|rather than).{0,20}(view|reshape)|"
                    r"interleav\w+|(channels?|axes) (are |get )?(scrambled|mixed|interleaved)|"
                    r"channels?[- ]last.{0,60}(view|reshape)")
def imu_conv1d_view(fixed: bool = False):
    seed(0)
    x, y = axis_windows(1300, 3)
    model = IMUConvNet(permute=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1000], y[:1000]), 32),
                val_loader=loader(TensorDataset(x[1000:], y[1000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("aj_imu_conv1d_view_not_permute", fixed_of(imu_conv1d_view), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=200)


# --------------------------------------------------------------------------------------------------------------------
# 4. one-object box regression: targets stored as a list of one box, (batch, 1, 4), against (batch, 4) predictions

class BoxRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 4), nn.Sigmoid())

    def forward(self, img):
        return self.net(img)


def box_loss(model, batch):
    img, boxes = batch
    return F.smooth_l1_loss(model(img), boxes, beta=0.05)


@case("aj_box_targets_broadcast", "shapes",
      bug="The detection Dataset returns each image's boxes as a list of one box, so the batched targets are "
          "(batch, 1, 4) while the head predicts (batch, 4); F.smooth_l1_loss broadcasts them to (batch, batch, 4), "
          "comparing every prediction with every box of the batch, and the head learns the mean box.",
      cause_pattern=r"\(\s*(batch|B|N|32)\s*,\s*1\s*,\s*4\s*\)|\[\s*(32|B|N)\s*,\s*1\s*,\s*4\s*\]|"
                    r"\(\s*(32|B|N|batch)\s*,\s*(32|B|N|batch)\s*,\s*4\s*\)|\bsqueeze\(1\).{0,40}(target|box)|"
                    r"(target|box)\w*.{0,40}\bsqueeze\(1\)|(list of|extra dimension for the) (one )?box|"
                    r"every prediction (with|against) every (box|target)|mean box")
def box_targets_broadcast(fixed: bool = False):
    seed(0)
    img, box = box_images(1300, 4)
    targets = box if fixed else box[:, None, :]       # the annotation format: a list of (here one) boxes
    model = BoxRegressor()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(img[:1000], targets[:1000]), 32),
                val_loader=loader(TensorDataset(img[1000:], targets[1000:]), 100, shuffle=False),
                loss_fn=box_loss, max_steps=600)


fix("aj_box_targets_broadcast", fixed_of(box_targets_broadcast), mean_iou, "val mean IoU", steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 5. frame-level voice activity detection: labels padded time-major by pad_sequence's default batch_first=False

def vad_clips(n: int, s: int):
    """Variable-length clips of 8 energy features per frame; frames inside one or two speech segments are 1."""
    g = gen(s)
    clips = []
    for _ in range(n):
        T = int(torch.randint(18, 36, (1,), generator=g))
        lab = torch.zeros(T, dtype=torch.long)
        for _ in range(int(torch.randint(1, 3, (1,), generator=g))):
            a = int(torch.randint(0, T - 4, (1,), generator=g))
            lab[a:a + int(torch.randint(3, 10, (1,), generator=g))] = 1
        feat = torch.randn(T, 8, generator=g) * 0.6
        feat[:, :4] += lab[:, None].float() * 1.2
        clips.append((feat, lab))
    return clips


def vad_collate(time_major_labels: bool):
    def collate(batch):
        feats, labels = zip(*batch)
        x = pad_sequence(feats, batch_first=True)
        if time_major_labels:
            y = pad_sequence(labels, padding_value=-100)                   # (time, batch)
        else:
            y = pad_sequence(labels, batch_first=True, padding_value=-100)  # (batch, time)
        return x, y
    return collate


class FrameGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 32, batch_first=True, bidirectional=True)
        self.out = nn.Linear(64, 2)

    def forward(self, x):
        return self.out(self.gru(x)[0])          # (batch, time, 2)


def frame_loss(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, 2), y.reshape(-1), ignore_index=-100)


_VAD_VAL = vad_clips(240, 51)


def vad_val_batches():
    return DataLoader(_VAD_VAL, batch_size=60, collate_fn=vad_collate(False))


@case("aj_vad_labels_pad_sequence_time_major", "shapes",
      bug="The collate_fn pads the frame features with pad_sequence(..., batch_first=True) but the frame labels with "
          "pad_sequence's default batch_first=False, so labels are (time, batch) against (batch, time, 2) logits; "
          "both are flattened with reshape(-1) before cross_entropy and every frame is scored against another "
          "clip's label.",
      cause_pattern=r"pad_sequence|(labels?|targets?)\W.{0,60}batch_first|batch_first\W.{0,60}(labels?|targets?|collate)|"
                    r"\(time, ?batch\)|\(T, ?B\)|time[- ]major|labels?\W.{0,60}(transposed|misaligned|not aligned|out of "
                    r"(order|alignment))|(misaligned|mismatched|not aligned).{0,40}(labels?|targets?)")
def vad_pad_sequence(fixed: bool = False):
    seed(0)
    clips = vad_clips(800, 5)
    model = FrameGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(clips, 32, collate_fn=vad_collate(not fixed)),
                val_loader=DataLoader(_VAD_VAL, batch_size=60, collate_fn=vad_collate(not fixed)),
                loss_fn=frame_loss, max_steps=500)


fix("aj_vad_labels_pad_sequence_time_major", fixed_of(vad_pad_sequence),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]), batches=vad_val_batches), "val frame accuracy", steps=150)
