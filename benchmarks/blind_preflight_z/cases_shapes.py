"""Shapes: tensors reshaped or reduced along the wrong axis, so samples, positions or classes get mixed."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_z.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    plain_acc,
    seed,
    tensor_loaders,
    to_dev,
)

# --------------------------------------------------------------------------------------------------------------
# 1. Activity recognition from accelerometer windows: a 2-layer GRU whose final states of both layers are
#    "concatenated" with h_n.view(batch, -1) -- h_n is (num_layers, batch, hidden), so the view glues rows of
#    different samples together.


class ActivityGRU(nn.Module):
    def __init__(self, fixed: bool = False):
        super().__init__()
        self.gru = nn.GRU(3, 24, num_layers=2, batch_first=True)
        self.fc = nn.Linear(48, 4)
        self.fixed = fixed

    def forward(self, x):
        _, h_n = self.gru(x)
        batch = x.size(0)
        if self.fixed:
            feats = h_n.permute(1, 0, 2).reshape(batch, -1)
        else:
            feats = h_n.view(batch, -1)  # (2, B, 24) -> (B, 48): mixes samples
        return self.fc(feats)


def _activity_data(n=1400, t=20, s=11):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    freq = torch.tensor([0.0, 0.25, 0.6, 1.2])[y]
    amp = torch.tensor([0.2, 1.0, 1.0, 1.0])[y]
    tt = torch.arange(t).float()
    phase = torch.rand(n, 1, generator=g) * 6.28
    wave = amp[:, None] * torch.sin(freq[:, None] * tt + phase)
    x = torch.stack([wave, 0.5 * wave.roll(1, 1), torch.zeros_like(wave)], -1)
    x = x + 0.3 * torch.randn(n, t, 3, generator=g)
    return x, y


@case("gru_hn_view_batch_mixing", "shapes",
      "The two GRU layers' final states are flattened with h_n.view(batch, -1) on the (num_layers, batch, hidden) "
      "tensor, so each row of the classifier input is built from two different samples of the batch instead of "
      "one sample's two layers.",
      r"h_n|hidden.{0,30}view|view\(batch|(num_layers|layers?)\W+batch|mix(es|ing)? (samples|rows|examples)|"
      r"(samples|examples) (are )?(mixed|interleaved)|permute\(1, ?0|transpose\(0, ?1\)")
def gru_hn_view_batch_mixing(fixed: bool = False):
    seed(0)
    x, y = _activity_data()
    train, val = tensor_loaders(x, y, 1100)
    model = ActivityGRU(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), train_loader=train,
                val_loader=val, loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("gru_hn_view_batch_mixing", fixed_of(gru_hn_view_batch_mixing), plain_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 2. Colour-blob classifier fed numpy images stored as (H, W, C); the Dataset turns each one into (C, H, W)
#    with .view(3, 16, 16) instead of .permute(2, 0, 1), which interleaves the colour planes.


class BlobImages(Dataset):
    def __init__(self, images_hwc, labels, fixed=False):
        self.images, self.labels, self.fixed = images_hwc, labels, fixed

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = torch.from_numpy(self.images[i])
        img = img.permute(2, 0, 1).contiguous() if self.fixed else img.view(3, 16, 16)
        return img, int(self.labels[i])


def _blob_images(n, s):
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    img = 0.35 * torch.rand(n, 16, 16, 3, generator=g)
    r = torch.randint(0, 12, (n,), generator=g)
    c = torch.randint(0, 12, (n,), generator=g)
    for i in range(n):
        img[i, r[i]:r[i] + 4, c[i]:c[i] + 4, y[i]] += 0.8
    return img.numpy(), y.numpy()


@case("hwc_image_view_not_permute", "shapes",
      "Channels-last (H, W, C) images are turned into (C, H, W) with .view(3, 16, 16) instead of .permute(2, 0, 1), "
      "so the colour planes are interleaved along the width and the colour of the blob becomes a shifted periodic "
      "pattern the CNN cannot tell apart.",
      r"permute\(2, ?0, ?1\)|channels?[- ]last|HWC|\(H, ?W, ?C\)|channel (order|axis|dimension)|"
      r"view\(3|view instead of permute|reshape.{0,40}(permute|transpose)|interleav")
def hwc_image_view_not_permute(fixed: bool = False):
    seed(0)
    xt, yt = _blob_images(1200, 1)
    xv, yv = _blob_images(400, 2)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(16, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(BlobImages(xt, yt, fixed), 32),
                val_loader=loader(BlobImages(xv, yv, fixed), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


fix("hwc_image_view_not_permute", fixed_of(hwc_image_view_not_permute), plain_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 3. Part-of-speech style tagger: logits (B, T, C) are reshaped to (B, C, T) with .view to please
#    F.cross_entropy's (N, C, d) layout, instead of .permute(0, 2, 1) / .transpose(1, 2).

VOCAB, TAGS, SEQ = 60, 5, 12


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.rnn = nn.GRU(32, 32, batch_first=True, bidirectional=True)
        self.out = nn.Linear(64, TAGS)

    def forward(self, tokens):
        h, _ = self.rnn(self.emb(tokens))
        return self.out(h)  # (B, T, C)


def _tag_data(n, s):
    g = gen(s)
    tokens = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    base = torch.randint(0, TAGS, (VOCAB,), generator=gen(99))
    prev = torch.cat([torch.zeros(n, 1, dtype=torch.long), tokens[:, :-1]], 1)
    tags = (base[tokens] + (prev % 2)) % TAGS
    return tokens, tags


def _tag_loss(fixed):
    def loss_fn(model, batch):
        tokens, tags = to_dev(model, *batch)
        logits = model(tokens)
        b, t, c = logits.shape
        logits = logits.permute(0, 2, 1) if fixed else logits.view(b, c, t)
        return F.cross_entropy(logits, tags)
    return loss_fn


@case("seq_logits_view_for_ce", "shapes",
      "The tagger's (batch, seq_len, num_tags) logits are reshaped to (batch, num_tags, seq_len) with .view(b, c, t) "
      "before F.cross_entropy instead of .permute(0, 2, 1), so every target is scored against logits of other "
      "positions and tags.",
      r"logits\.(permute|transpose)|(permute|transpose).{0,40}logits|logits.{0,60}(view|reshap).{0,60}(permute|"
      r"transpose)|view\(b, ?c, ?t\)|\(N, ?C, ?d|(cross_entropy|CrossEntropy).{0,80}(class|tag)e?s? (dimension|axis)|"
      r"(class|tag) (dimension|axis).{0,60}(second|dim(ension)? 1)")
def seq_logits_view_for_ce(fixed: bool = False):
    seed(0)
    xt, yt = _tag_data(1500, 3)
    xv, yv = _tag_data(400, 4)
    model = Tagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 32), val_loader=loader(TensorDataset(xv, yv), 200, False),
                loss_fn=_tag_loss(fixed))


fix("seq_logits_view_for_ce", fixed_of(seq_logits_view_for_ce),
    acc_of(lambda m, b: (m(to_dev(m, b[0])[0]).argmax(-1), b[1])), "val token accuracy")

# --------------------------------------------------------------------------------------------------------------
# 4. Machine-vibration fault detector: a Conv1d over sensor windows stored as (batch, time, channels). Conv1d
#    wants (batch, channels, time); after "in_channels expected 4 but got 64" the user set in_channels to the
#    window length instead of transposing, so the kernel slides over the 4 sensor channels, not over time.

WIN, SENSORS = 64, 4


class FaultCNN(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed
        c_in = SENSORS if fixed else WIN
        self.conv = nn.Sequential(nn.Conv1d(c_in, 16, 5, padding=2), nn.ReLU(), nn.Conv1d(16, 16, 5, padding=2),
                                  nn.ReLU(), nn.AdaptiveMaxPool1d(1), nn.Flatten())
        self.fc = nn.Linear(16, 2)

    def forward(self, x):  # x: (batch, time, channels)
        if self.fixed:
            x = x.transpose(1, 2)
        return self.fc(self.conv(x))


def _vibration(n, s):
    """A short chirp burst at a random time in sensor 0 marks a fault; background noise everywhere."""
    g = gen(s)
    x = 0.5 * torch.randn(n, WIN, SENSORS, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    burst = torch.tensor([1.0, -1.5, 2.0, -1.5, 1.0, -0.5])
    decoy = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0]) * 0.9
    at = torch.randint(0, WIN - 6, (n,), generator=g)
    for i in range(n):
        x[i, at[i]:at[i] + 6, 0] += burst if y[i] == 1 else decoy
    return x, y


@case("conv1d_over_channels_not_time", "shapes",
      "Sensor windows of shape (batch, time=64, channels=4) go into nn.Conv1d(in_channels=64) without .transpose(1, "
      "2): Conv1d treats dim 1 as channels, so the 64 time steps become input channels and the kernel slides over "
      "the 4 sensors instead of over time, losing the shift-invariant detector of the burst.",
      r"Conv1d.{0,80}(channel|time|length)|\(batch, ?channels?, ?(time|length|L)|\(N, ?C, ?L|in_channels=64|"
      r"time (axis|dimension|steps?) (as|become|treated as) (input )?channels")
def conv1d_over_channels_not_time(fixed: bool = False):
    seed(0)
    xt, yt = _vibration(1500, 5)
    xv, yv = _vibration(500, 6)
    model = FaultCNN(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt, yt), 32), val_loader=loader(TensorDataset(xv, yv), 250, False),
                loss_fn=nn.CrossEntropyLoss())


fix("conv1d_over_channels_not_time", fixed_of(conv1d_over_channels_not_time), plain_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 5. Transformer over batch-first token streams with the PositionalEncoding copied from the seq-first
#    tutorial: pe is (max_len, 1, d) and is added as pe[:x.size(0)], i.e. indexed by the batch size.

ORD_VOCAB, ORD_LEN = 16, 10


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=512, fixed=False):
        super().__init__()
        pos = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(pos * div)
        pe[:, 0, 1::2] = torch.cos(pos * div)
        self.register_buffer("pe", pe)
        self.fixed = fixed

    def forward(self, x):
        if self.fixed:
            return x + self.pe[: x.size(1)].transpose(0, 1)
        return x + self.pe[: x.size(0)]  # tutorial code: x is (seq, batch, d) there, (batch, seq, d) here


class OrderClassifier(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.emb = nn.Embedding(ORD_VOCAB, 32)
        self.pos = PositionalEncoding(32, fixed=fixed)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(32, 2)

    def forward(self, tokens):
        h = self.enc(self.pos(self.emb(tokens) * math.sqrt(32)))
        return self.out(h.mean(1))


def _order_data(n, s):
    """Increasing vs decreasing runs of token ids: the same bag of tokens, only the order tells them apart."""
    g = gen(s)
    start = torch.randint(0, ORD_VOCAB, (n, 1), generator=g)
    step = torch.randint(1, 3, (n, 1), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    run = (start + step * torch.arange(ORD_LEN)) % ORD_VOCAB
    tokens = torch.where(y[:, None] == 1, run, run.flip(1))
    return tokens, y


@case("posenc_seq_first_on_batch_first", "shapes",
      "The tutorial PositionalEncoding (pe of shape (max_len, 1, d_model), added as pe[:x.size(0)]) is applied to "
      "batch_first (batch, seq, d_model) embeddings, so it is sliced by the batch size and broadcast over the "
      "sequence: every position of a sample gets the same vector and the transformer sees no order.",
      r"positional (encoding|embedding)|pe\[:x\.size\(0\)\]|x\.size\(0\)|batch_first.{0,80}(position|seq)|"
      r"(seq|sequence)[- ]first|\(max_len, ?1|no (order|position)")
def posenc_seq_first_on_batch_first(fixed: bool = False):
    seed(0)
    xt, yt = _order_data(1500, 7)
    xv, yv = _order_data(400, 8)
    model = OrderClassifier(fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(xt, yt), 32), val_loader=loader(TensorDataset(xv, yv), 200, False),
                loss_fn=nn.CrossEntropyLoss(), clip_grad_norm=1.0)


fix("posenc_seq_first_on_batch_first", fixed_of(posenc_seq_first_on_batch_first), plain_acc, "val accuracy")
