"""Set at's case registry: set a's Case / CaseTable and helpers, this set's case table, the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``), and the synthetic multimodal / geometric data and small
models the cases share (point clouds, video clips, image-caption pairs, a 'pretrained' tabular backbone)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import Dataset

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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_at")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rmse_of(fwd):
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


def acc_of(fwd):
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, kw["val_loader"], fn)
    return metric


class Pairs(Dataset):
    """A list-of-tensors dataset returning tuples."""

    def __init__(self, *tensors):
        self.t = tensors

    def __len__(self):
        return len(self.t[0])

    def __getitem__(self, i):
        return tuple(t[i] for t in self.t)


# ---------------------------------------------------------------- point clouds
SHAPE_SCALES = torch.tensor([[1.0, 1.0, 1.0],    # blob
                             [2.2, 0.45, 0.45],  # rod along x
                             [0.45, 2.2, 0.45],  # rod along y
                             [0.45, 0.45, 2.2],  # rod along z
                             [1.3, 1.3, 0.15]])  # flat disk


def point_clouds(n, n_points=64, s=0, offset=0.0, size_range=(0.6, 1.6)):
    """(n, n_points, 3) clouds of 5 axis-aligned shapes, random overall size and translation; returns pts, label,
    size (the overall size factor)."""
    g = gen(s)
    y = torch.randint(0, len(SHAPE_SCALES), (n,), generator=g)
    size = torch.empty(n).uniform_(*size_range, generator=g)
    pts = torch.randn(n, n_points, 3, generator=g) * SHAPE_SCALES[y][:, None, :] * size[:, None, None]
    pts = pts + offset * torch.randn(n, 1, 3, generator=g)
    return pts, y, size


class PointNet(nn.Module):
    """Shared per-point MLP (Conv1d k=1 over (B, 3, N)), max pool over points, MLP head."""

    def __init__(self, n_classes=5, width=64, out=None):
        super().__init__()
        self.feat = nn.Sequential(nn.Conv1d(3, 32, 1), nn.ReLU(), nn.Conv1d(32, width, 1), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, out or n_classes))

    def forward(self, pts):  # pts: (B, N, 3)
        x = self.feat(pts.transpose(1, 2))
        return self.head(x.max(dim=2).values)


# ---------------------------------------------------------------- video clips
DIRS = torch.tensor([[0, 1], [0, -1], [1, 0], [-1, 0]])  # right, left, down, up


def moving_blobs(n, frames=12, hw=10, s=0):
    """(n, frames, hw, hw, 3) channels-last videos of a coloured 2x2 blob moving one pixel per frame in one of four
    directions (the label), plus noise; also returns the dominant colour channel of each blob."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    colour = torch.rand(n, 3, generator=g) * 0.7 + 0.3
    vid = 0.1 * torch.randn(n, frames, hw, hw, 3, generator=g)
    start = torch.randint(0, hw - 2, (n, 2), generator=g)
    for i in range(n):
        d = DIRS[y[i]]
        for t in range(frames):
            r, c = (start[i] + d * t) % (hw - 1)
            vid[i, t, r:r + 2, c:c + 2] += colour[i]
    return vid, y, colour.argmax(1)


class Video3D(nn.Module):
    """Conv3d over (B, C, T, H, W)."""

    def __init__(self, n_classes=4, c=16):
        super().__init__()
        self.net = nn.Sequential(nn.Conv3d(3, c, 3, padding=1), nn.ReLU(), nn.Conv3d(c, c, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(c, n_classes))

    def forward(self, x):
        return self.net(x)


def frame_sequences(n, length=64, feat=8, n_classes=5, s=0):
    """Per-frame features (n, length, feat) and per-frame labels (n, length): short segments of 3-7 frames, each
    frame a noisy class prototype."""
    g = gen(s)
    proto = torch.randn(n_classes, feat, generator=gen(1234)) * 1.2  # the same classes in every split
    labels = torch.empty(n, length, dtype=torch.long)
    for i in range(n):
        t = 0
        while t < length:
            k = int(torch.randint(3, 8, (1,), generator=g))
            labels[i, t:t + k] = int(torch.randint(0, n_classes, (1,), generator=g))
            t += k
    x = proto[labels] + torch.randn(n, length, feat, generator=g)
    return x, labels


class FrameTagger(nn.Module):
    """Temporal conv net over (B, T, F) -> per-frame logits (B, C, T)."""

    def __init__(self, feat=8, n_classes=5, h=32):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(feat, h, 5, padding=2), nn.ReLU(), nn.Conv1d(h, n_classes, 1))

    def forward(self, x):
        return self.net(x.transpose(1, 2))


# ---------------------------------------------------------------- image-caption pairs
COLOURS = ["red", "green", "blue", "yellow"]
RGB = torch.tensor([[1.0, 0.1, 0.1], [0.1, 1.0, 0.1], [0.1, 0.1, 1.0], [1.0, 1.0, 0.1]])
FILLER = ["a", "photo", "of", "the", "small", "picture", "with", "one"]


def image_captions(n, s=0):
    """8x8 RGB images of a coloured 3x3 square in one of four quadrants; captions such as
    'a photo of red square top left'; combo = colour * 4 + quadrant."""
    g = gen(s)
    col = torch.randint(0, 4, (n,), generator=g)
    vert = torch.randint(0, 2, (n,), generator=g)
    horiz = torch.randint(0, 2, (n,), generator=g)
    img = 0.15 * torch.randn(n, 3, 8, 8, generator=g)
    caps = []
    for i in range(n):
        r, c = 4 * int(vert[i]), 5 * int(horiz[i])  # left: columns 0-2, right: 5-7 (mirror images)
        img[i, :, r + 1:r + 4, c:c + 3] += RGB[col[i]][:, None, None]
        k = int(torch.randint(0, 5, (1,), generator=g))
        fill = [FILLER[int(j)] for j in torch.randint(0, len(FILLER), (k,), generator=g)]
        caps.append(" ".join(fill + [COLOURS[col[i]], "square", ["top", "bottom"][vert[i]],
                                     ["left", "right"][horiz[i]]]))
    combo = col * 4 + vert * 2 + horiz
    return img, caps, combo


def build_vocab(captions):
    """Word -> id in order of first appearance (0 is padding)."""
    vocab = {}
    for c in captions:
        for w in c.split():
            vocab.setdefault(w, len(vocab) + 1)
    return vocab


class CaptionSet(Dataset):
    def __init__(self, images, captions, combo, vocab, flip_p=0.0, s=0):
        self.images, self.captions, self.combo, self.vocab = images, captions, combo, vocab
        self.flip_p, self.g = flip_p, gen(s)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        img = self.images[i]
        if self.flip_p and torch.rand(1, generator=self.g).item() < self.flip_p:
            img = torch.flip(img, dims=[-1])  # horizontal flip augmentation
        ids = torch.tensor([self.vocab.get(w, 0) for w in self.captions[i].split()])
        return img, ids, self.combo[i]


def pad_collate(batch):
    imgs, ids, combo = zip(*batch)
    lengths = torch.tensor([len(t) for t in ids])
    tokens = nn.utils.rnn.pad_sequence(list(ids), batch_first=True)
    return torch.stack(imgs), tokens, lengths, torch.stack(list(combo))


class DualEncoder(nn.Module):
    """CLIP-style: small conv image tower, GRU text tower over padded tokens, both projected and L2-normalised."""

    def __init__(self, vocab_size=40, d=32, scale=10.0):
        super().__init__()
        self.image = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                   nn.Linear(16 * 16, d))
        self.emb = nn.Embedding(vocab_size, 32, padding_idx=0)
        self.gru = nn.GRU(32, d, batch_first=True)
        self.proj = nn.Linear(d, d)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(scale)))

    def encode_text(self, tokens, lengths, sorted_=False):
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(tokens), lengths.cpu(), batch_first=True,
                                                   enforce_sorted=sorted_)
        _, h = self.gru(packed)
        return nn.functional.normalize(self.proj(h[-1]), dim=-1)

    def encode_image(self, img):
        return nn.functional.normalize(self.image(img), dim=-1)

    def forward(self, img, tokens, lengths):
        return self.logit_scale.exp().clamp(max=100) * self.encode_image(img) @ self.encode_text(tokens, lengths).T


def clip_loss(model, batch):
    img, tokens, lengths, _ = batch
    logits = model(img, tokens, lengths)
    labels = torch.arange(len(img), device=logits.device)
    return (nn.functional.cross_entropy(logits, labels) + nn.functional.cross_entropy(logits.T, labels)) / 2


def retrieval_acc(model, kw):
    """Image -> text top-1 within each validation batch; a retrieved caption counts when it describes the same
    colour and quadrant."""
    def fn(m, b):
        img, tokens, lengths, combo = b
        pick = m(img, tokens, lengths).argmax(1)
        return (combo[pick] == combo).sum().item(), len(combo)
    return mean_over(model, kw["val_loader"], fn)


def caption_loaders(n_train=1024, n_val=256, flip_p=0.0, bs=32):
    img, caps, combo = image_captions(n_train + n_val, s=5)
    vocab = build_vocab(caps[:n_train])
    tr = CaptionSet(img[:n_train], caps[:n_train], combo[:n_train], vocab, flip_p=flip_p)
    va = CaptionSet(img[n_train:], caps[n_train:], combo[n_train:], vocab)
    return (loader(tr, bs, collate_fn=pad_collate, drop_last=True),
            loader(va, 64, shuffle=False, collate_fn=pad_collate), vocab)


# ---------------------------------------------------------------- 'pretrained' backbone for fine-tuning
def ft_data(n, s=0, use_first=True):
    """(n, 24) sensor features; labels from a linear teacher on features 0-3 (use_first) or on features 4-11."""
    g = gen(s)
    x = torch.randn(n, 24, generator=g)
    w = torch.randn(8 if not use_first else 4, 4, generator=gen(99))
    z = x[:, :4] if use_first else x[:, 4:12]
    return x, (z @ w).argmax(1)


class Backbone(nn.Module):
    """A 'pretrained' MLP: its first layer ignores features 0-3 (zero weights there, as if pretrained on a task
    that never used those sensors)."""

    def __init__(self, s=7):
        super().__init__()
        torch.manual_seed(s)
        self.fc1 = nn.Linear(24, 64)
        self.fc2 = nn.Linear(64, 32)
        with torch.no_grad():
            self.fc1.weight[:, :4] = 0.0

    def forward(self, x):
        return torch.relu(self.fc2(torch.relu(self.fc1(x))))


class FTNet(nn.Module):
    def __init__(self, n_classes=4, s=7):
        super().__init__()
        self.backbone = Backbone(s)
        self.head = nn.Linear(32, n_classes)

    def forward(self, x):
        return self.head(self.backbone(x))


class LoRALinear(nn.Module):
    """y = base(x) + scaling * (x A^T) B^T with the base layer frozen."""

    def __init__(self, base: nn.Linear, r=4, alpha=8, zero_a=False, int_div=False):
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad = False
        self.A = nn.Parameter(torch.zeros(r, base.in_features))
        self.B = nn.Parameter(torch.zeros(base.out_features, r))
        if not zero_a:
            nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        self.scaling = alpha // r if int_div else alpha / r

    def forward(self, x):
        return self.base(x) + self.scaling * (x @ self.A.T) @ self.B.T


def ft_loaders(use_first=True, n_train=1024, n_val=512, bs=32):
    x, y = ft_data(n_train + n_val, s=3, use_first=use_first)
    return (loader(Pairs(x[:n_train], y[:n_train]), bs),
            loader(Pairs(x[n_train:], y[n_train:]), 128, shuffle=False))
