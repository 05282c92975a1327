"""Set r, family shapes: tensors laid out in an order the layer does not expect (no crash, wrong meaning)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_r.registry import case, eval_acc, fix, fixed_of, gen, loader, seed

# --- 1. human-activity recognition: nn.LSTM left seq-first while the windows are (batch, time, xyz) --------------


def har_windows(n, s):
    g = gen(s)
    t = torch.arange(20).float() / 20
    y = torch.randint(0, 4, (n,), generator=g)
    freq = (1 + y.float() * 1.5)[:, None]
    phase = torch.rand(n, 1, generator=g) * 6.28
    base = torch.sin(2 * math.pi * freq * t[None] + phase)
    x = torch.stack([base, 0.5 * base + 0.3 * torch.randn(n, 20, generator=g),
                     0.3 * torch.randn(n, 20, generator=g)], -1)
    return x + 0.1 * torch.randn(n, 20, 3, generator=g), y


class ActivityLSTM(nn.Module):
    def __init__(self, batch_first):
        super().__init__()
        self.lstm = nn.LSTM(3, 32, batch_first=batch_first)
        self.out = nn.Linear(32, 4)

    def forward(self, x):               # x: (batch, 20 steps, 3 axes) from the window dataset
        h, _ = self.lstm(x)
        return self.out(h[:, -1])


def har_lstm(fixed=False):
    seed(0)
    x, y = har_windows(1200, 1)
    vx, vy = har_windows(400, 2)
    model = ActivityLSTM(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("har_lstm_seq_first", "shapes",
     "nn.LSTM is built without batch_first=True but is fed (batch, time, features) windows, so it recurs over the "
     "batch dimension and treats the 20 time steps as the batch; h[:, -1] mixes different samples.",
     r"batch_first|(recur|iterat|run)s? (over|along|across) the batch|batch (dimension|axis) (is )?(treated|taken|read|used) as "
     r"(the )?(time|sequence)|(time|sequence) (dimension|axis|steps?) (is |are )?(treated|taken|read|used) as (the )?batch|"
     r"\(seq(uence)?(_len)?, ?batch|seq(uence)?[- ]first")(har_lstm)
fix("har_lstm_seq_first", fixed_of(har_lstm), lambda m, kw: eval_acc(m, kw["val_loader"], lambda mm, b: (mm(b[0]).argmax(-1), b[1])),
    "val accuracy")

# --- 2. keyword spotting: a (batch, mels, frames) spectrogram .view()-ed to (batch, frames, mels) ----------------


def kws_data(n, s):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    frames = torch.arange(24).float()
    mels = torch.arange(16).float()
    start = torch.randint(0, 6, (n,), generator=g).float()
    rel = frames[None] - start[:, None] - 7
    shape = torch.stack([0.5 * rel, -0.5 * rel, 3.5 - 0.5 * rel.abs(), 0.5 * rel.abs() - 3.5], 1)   # up, down, arch, dip
    centre = 7.5 + shape[torch.arange(n), y]
    spec = torch.exp(-0.5 * (mels[None, :, None] - centre[:, None, :]) ** 2)      # (n, 16 mels, 24 frames)
    on = ((frames[None] >= start[:, None]) & (frames[None] < start[:, None] + 14)).float()
    spec = spec * on[:, None, :]
    return spec + 0.5 * torch.randn(n, 16, 24, generator=g), y


class KeywordGRU(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.out = nn.Linear(32, 4)

    def forward(self, spec):            # spec: (batch, 16 mels, 24 frames)
        b = spec.shape[0]
        frames = spec.transpose(1, 2) if self.fixed else spec.view(b, 24, 16)
        h, _ = self.gru(frames)
        return self.out(h[:, -1])


def kws_view(fixed=False):
    seed(0)
    x, y = kws_data(400, 3)
    vx, vy = kws_data(500, 4)
    model = KeywordGRU(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("kws_spectrogram_view_not_transpose", "shapes",
     "The (batch, mels, frames) spectrogram is reshaped with .view(batch, frames, mels) instead of transposed, so each "
     "GRU step gets a scrambled slice of one mel band's time series rather than one frame's 16 mel energies.",
     r"\.?view\(.{0,60}(instead of|rather than|not).{0,30}(transpose|permute)|(transpose|permute)\(.{0,40}(instead of|rather than|not)"
     r".{0,20}view|(view|reshape)\w* (scrambles|mixes|interleaves|reorders)|(scrambles|mixes|interleaves) (the )?(mel|frequency|"
     r"time|frame)|(mels?|frequency|frames?) and (frames?|time|mels?) (are )?(mixed|scrambled|interleaved)")(kws_view)
fix("kws_spectrogram_view_not_transpose", fixed_of(kws_view),
    lambda m, kw: eval_acc(m, kw["val_loader"], lambda mm, b: (mm(b[0]).argmax(-1), b[1])), "val accuracy")

# --- 3. review sentiment: Conv1d over (batch, tokens, emb) with in_channels = the sequence length ------------------

VOCAB, LEN = 200, 30
POS, NEG = list(range(10, 20)), list(range(20, 30))


def reviews(n, s):
    g = gen(s)
    toks = torch.randint(30, VOCAB, (n, LEN), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        k = int(torch.randint(1, 4, (1,), generator=g))
        pos = torch.randperm(LEN, generator=g)[:k]
        words = POS if y[i] == 1 else NEG
        toks[i, pos] = torch.tensor([words[int(j)] for j in torch.randint(0, 10, (k,), generator=g)])
    return toks, y


class ReviewCNN(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(VOCAB, 16)
        # tutorial said Conv1d(in_channels, ...); the first dim after the batch of the embeddings is the 30 tokens
        self.conv = nn.Conv1d(16 if fixed else LEN, 32, 3, padding=1)
        self.out = nn.Linear(32, 2)

    def forward(self, toks):
        e = self.emb(toks)                           # (batch, 30 tokens, 16)
        if self.fixed:
            e = e.permute(0, 2, 1)                   # (batch, 16, 30 tokens)
        h = F.relu(self.conv(e))
        return self.out(h.max(-1).values)


def sentiment_conv(fixed=False):
    seed(0)
    x, y = reviews(1500, 5)
    vx, vy = reviews(500, 6)
    model = ReviewCNN(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("sentiment_conv1d_channels_are_tokens", "shapes",
     "nn.Conv1d is given the (batch, tokens, embedding) tensor without permute(0, 2, 1), with in_channels set to the "
     "sequence length, so it convolves across the embedding dimension and treats token positions as channels.",
     r"conv1d.{0,120}(permute|transpose|channels?[- ]first|\(batch, ?(emb|embedding|channels?|features?), ?(seq|len|tokens?))|"
     r"(permute|transpose)\(0, ?2, ?1\)|in_channels.{0,60}(sequence|seq|tokens?|length)|(tokens?|positions?|sequence) "
     r"(positions? )?(are |is )?(treated|used|taken) as (the )?channels|convolv\w* (over|across|along) (the )?(embedding|feature)")(sentiment_conv)
fix("sentiment_conv1d_channels_are_tokens", fixed_of(sentiment_conv),
    lambda m, kw: eval_acc(m, kw["val_loader"], lambda mm, b: (mm(b[0]).argmax(-1), b[1])), "val accuracy")

# --- 4. land-cover segmentation: logits.view(-1, C) straight from NCHW ----------------------------------------------


def tiles(n, s):
    g = gen(s)
    x = torch.randn(n, 3, 16, 16, generator=g)
    x = F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), 3, 1) * 2
    y = torch.stack([x[:, 0], x[:, 1], x[:, 2], -x.sum(1) * 0.6], 1).argmax(1)
    return x, y


class TinyFCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 4, 1))

    def forward(self, x):
        return self.net(x)


def seg_loss(fixed):
    def loss_fn(model, batch):
        x, y = batch
        logits = model(x)                                        # (batch, 4, 16, 16)
        flat = logits.permute(0, 2, 3, 1).reshape(-1, 4) if fixed else logits.view(-1, 4)
        return F.cross_entropy(flat, y.reshape(-1))
    return loss_fn


def landcover(fixed=False):
    seed(0)
    x, y = tiles(600, 7)
    vx, vy = tiles(200, 8)
    model = TinyFCN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 16), val_loader=loader(TensorDataset(vx, vy), 50, shuffle=False),
                loss_fn=seg_loss(fixed), max_steps=300)


case("landcover_logits_view_without_permute", "shapes",
     "The (N, C, H, W) segmentation logits are flattened with logits.view(-1, num_classes) without first permuting the "
     "class dimension last, so each row of 4 'class scores' is 4 neighbouring pixels of one class map and no longer "
     "lines up with y.view(-1).",
     r"permute\(0, ?2, ?3, ?1\)|view\(-1, ?(num_classes|n_classes|c|4)\).{0,80}(permut|channels?[- ]last|class (dim|axis))|"
     r"(without|before|missing|no) (a )?permut\w*.{0,60}(class|channel)|class (dimension|axis|channel).{0,60}(last|permut|misalign)|"
     r"pixels? (of one class|and classes).{0,40}(mixed|misaligned|scrambled)|logits?.{0,40}(misaligned|do not line up|don't line up) "
     r"with (the )?(targets?|labels?|masks?)")(landcover)
fix("landcover_logits_view_without_permute", fixed_of(landcover),
    lambda m, kw: eval_acc(m, kw["val_loader"], lambda mm, b: (mm(b[0]).argmax(1), b[1])), "val pixel accuracy")

# --- 5. plankton images from numpy HWC arrays reshaped, not transposed, to CHW ------------------------------------


def plankton(n, s):
    g = np.random.default_rng(s)
    imgs = np.full((n, 15, 15, 3), 0.5, dtype=np.float32) + 0.25 * g.standard_normal((n, 15, 15, 3)).astype(np.float32)
    y = g.integers(0, 4, n)
    colours = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]], dtype=np.float32)
    for i in range(n):
        r, c = g.integers(2, 11, 2)
        imgs[i, r:r + 3, c:c + 3] = colours[y[i]]
    return imgs, y


class PlanktonCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(16, 4))

    def forward(self, x):
        return self.net(x)


def to_chw(imgs, fixed):
    t = torch.from_numpy(imgs)
    n, h, w, c = t.shape
    return t.permute(0, 3, 1, 2).contiguous() if fixed else t.reshape(n, c, h, w)   # "PyTorch wants (N, C, H, W)"


def plankton_case(fixed=False):
    seed(0)
    x, y = plankton(300, 9)
    vx, vy = plankton(400, 10)
    model = PlanktonCNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(to_chw(x, fixed), torch.from_numpy(y)), 32),
                val_loader=loader(TensorDataset(to_chw(vx, fixed), torch.from_numpy(vy)), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("plankton_hwc_reshape_not_permute", "shapes",
     "The numpy (N, H, W, 3) images are turned into (N, 3, H, W) with reshape instead of permute/transpose, so the "
     "'channels' are slabs of rows with R, G and B interleaved along the width, and the conv sees scrambled pixels.",
     r"(reshape|view)\w*.{0,80}(instead of|rather than|not|without).{0,20}(permute|transpose)|(permute|transpose)\(0, ?3, ?1, ?2\)|"
     r"(hwc|nhwc|channels?[- ]last).{0,80}(reshap|view|permut|transpos)|(reshap|view)\w*.{0,40}(hwc|nhwc|channels?[- ]last)|"
     r"(rgb|colou?r channels?).{0,40}(interleaved|scrambled|mixed)")(plankton_case)
fix("plankton_hwc_reshape_not_permute", fixed_of(plankton_case),
    lambda m, kw: eval_acc(m, kw["val_loader"], lambda mm, b: (mm(b[0]).argmax(-1), b[1])), "val accuracy")
