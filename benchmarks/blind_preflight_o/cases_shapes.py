"""Set o, family shapes: an axis or a layout read the wrong way round, no error raised."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_o.registry import acc_of, case, fix, fixed_of, gen, loader, seed, tensors

# --------------------------------------------------------------------------------------------------------------
# Satellite tiles saved as numpy HWC arrays, "converted" to NCHW with reshape instead of a transpose.
# Source: https://runebook.dev/ru/docs/pytorch/generated/torch.tensor.permute (reshape where permute is needed
# scrambles the picture into noise)


def land_tiles(n: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, 12, 12, 3) float32 tiles as PIL/cv2 give them (HWC), a 2x2 patch whose colour is the land-use class."""
    rng = np.random.default_rng(s)
    colours = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]], dtype=np.float32)
    tiles = (0.3 * rng.standard_normal((n, 12, 12, 3))).astype(np.float32)
    labels = rng.integers(0, 4, n)
    rows, cols = rng.integers(0, 11, n), rng.integers(0, 11, n)
    for i in range(n):
        tiles[i, rows[i]:rows[i] + 2, cols[i]:cols[i] + 2, :] += colours[labels[i]]
    return tiles, labels


class TileNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc(self.features(x))


@case("shapes_tiles_reshaped_not_permuted", "shapes",
      "The HWC numpy tiles (N, 12, 12, 3) are turned into the (N, 3, 12, 12) the Conv2d expects with "
      "torch.tensor(arr).reshape(-1, 3, 12, 12) instead of permute(0, 3, 1, 2): reshape keeps the memory order, so "
      "every 'channel' holds a band of rows with the three colours interleaved along the width, the colour that "
      "decides the class is scrambled into pixel positions and the CNN never sees it.",
      r"permute|transpose|channels?[ -]last|HWC|NHWC|\(N, ?H, ?W, ?C\)|channel (order|axis|dim)|interleav|scrambl"
      r"|reshape\w* (instead of|rather than|is not|isn't|does not|doesn't)|memory (order|layout)")
def build_tiles(fixed: bool = False) -> dict:
    seed(0)
    arr, labels = land_tiles(1600, 1)
    if fixed:
        images = torch.tensor(arr).permute(0, 3, 1, 2).contiguous()
    else:
        images = torch.tensor(arr).reshape(-1, 3, 12, 12)
    y = torch.tensor(labels)
    model = TileNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tensors(images[:1280], y[:1280]), 64),
                val_loader=loader(tensors(images[1280:], y[1280:]), 160, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("shapes_tiles_reshaped_not_permuted", fixed_of(build_tiles), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# PointNet-style classifier whose log_softmax runs over dim=0 (the batch) instead of the classes.
# Source: https://github.com/fxia22/pointnet.pytorch/issues/27


def point_clouds(n: int, s: int, points: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Sphere, cube, cylinder and disk surfaces, each axis scaled by 0.6-1.4, with noise."""
    g = gen(s)
    labels = torch.randint(0, 4, (n,), generator=g)
    u = torch.randn(n, points, 3, generator=g)
    sphere = u / u.norm(dim=-1, keepdim=True)
    face = torch.randint(0, 3, (n, points), generator=g)
    cube = torch.rand(n, points, 3, generator=g) * 2 - 1
    cube.scatter_(2, face.unsqueeze(-1), torch.sign(torch.randn(n, points, 1, generator=g)))
    angle = torch.rand(n, points, generator=g) * 2 * torch.pi
    height = torch.rand(n, points, generator=g) * 2 - 1
    cylinder = torch.stack([angle.cos(), angle.sin(), height], -1)
    radius = torch.rand(n, points, generator=g).sqrt()
    disk = torch.stack([radius * angle.cos(), radius * angle.sin(), 0.05 * torch.randn(n, points, generator=g)], -1)
    clouds = torch.stack([sphere, cube, cylinder, disk], 1)[torch.arange(n), labels]
    scale = 0.6 + 0.8 * torch.rand(n, 1, 3, generator=g)
    return clouds * scale + 0.05 * torch.randn(n, points, 3, generator=g), labels


class PointNetLite(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.point_mlp = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 64), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, pts):                      # (B, N, 3)
        x = self.point_mlp(pts).max(dim=1).values
        return F.log_softmax(self.head(x), dim=self.dim)


@case("shapes_pointnet_log_softmax_dim0", "shapes",
      "The point-cloud classifier ends in F.log_softmax(x, dim=0) on its (B, 4) scores, so the log-probabilities are "
      "normalised over the batch instead of over the 4 classes and NLLLoss compares a sample with the other clouds "
      "in the batch, never the right class with the wrong ones; each class column is only ranked against other "
      "clouds, and a single cloud scored alone gets log-probabilities of 0 for every class.",
      r"dim ?= ?0|dimension 0|over the batch|across the batch|batch (dim|axis)|wrong (dim|axis)|along (dim|axis) 0"
      r"|(log_?)?softmax\w*\W+\w*\W*(dim|axis)|normali[sz]ed? over")
def build_pointnet(fixed: bool = False) -> dict:
    seed(0)
    x, y = point_clouds(1500, 2)
    model = PointNetLite(dim=1 if fixed else 0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(tensors(x[:1200], y[:1200]), 32),
                val_loader=loader(tensors(x[1200:], y[1200:]), 1, shuffle=False),    # one scan at a time, as served
                loss_fn=nn.NLLLoss(), max_steps=300)


fix("shapes_pointnet_log_softmax_dim0", fixed_of(build_pointnet),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# Session-based next-category model: right-padded sessions, the GRU output read at out[:, -1] (a padding step).
# Source: https://codemia.io/knowledge-hub/path/get_the_last_output_of_a_dynamic_rnn_in_tensorflow


def sessions(n: int, s: int, max_len: int = 40, items: int = 200) -> tuple[torch.Tensor, ...]:
    g = gen(s)
    category = torch.randint(0, 8, (items + 1,), generator=gen(99))
    lengths = torch.randint(2, max_len + 1, (n,), generator=g)
    seqs = torch.randint(1, items + 1, (n, max_len), generator=g)
    seqs[torch.arange(max_len).unsqueeze(0) >= lengths.unsqueeze(1)] = 0           # right padding with item 0
    last = seqs[torch.arange(n), lengths - 1]
    return seqs, lengths, category[last]


class SessionGRU(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed
        self.items = nn.Embedding(201, 32, padding_idx=0)
        self.gru = nn.GRU(32, 64, batch_first=True)
        self.out = nn.Linear(64, 8)

    def forward(self, seqs, lengths):
        out, _ = self.gru(self.items(seqs))
        if self.fixed:
            last = out[torch.arange(out.size(0), device=out.device), lengths.to(out.device) - 1]
        else:
            last = out[:, -1]
        return self.out(last)


def session_loss(model, batch):
    seqs, lengths, y = batch
    return F.cross_entropy(model(seqs, lengths), y)


@case("shapes_session_gru_reads_padding_step", "shapes",
      "The sessions are right-padded to 40 items and the GRU's summary is taken as out[:, -1], the output at the "
      "last padded position: for a session of 5 items that is 35 padding steps after the last real click, so the "
      "prediction of the next category is read after the information has washed out instead of at lengths - 1.",
      r"out(put)?\[:, ?-1\]|last (time ?)?step|last (real|valid|non-pad)|padd(ed|ing) (position|step|time ?step)s?"
      r"|lengths? ?- ?1|pack_padded_sequence|h_n|right[- ]padd|after the (last|end of the) (real|valid)")
def build_sessions(fixed: bool = False) -> dict:
    seed(0)
    seqs, lengths, y = sessions(2400, 3)
    model = SessionGRU(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tensors(seqs[:2000], lengths[:2000], y[:2000]), 64),
                val_loader=loader(tensors(seqs[2000:], lengths[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=session_loss, max_steps=300)


fix("shapes_session_gru_reads_padding_step", fixed_of(build_sessions),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# Motif detector with nn.MultiheadAttention (batch_first=False by default) fed (batch, seq, embed) tensors.
# Source: https://github.com/kyegomez/movie-gen/issues/8


def repeat_motif(n: int, s: int, length: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Label 1 when the first token occurs again later in the sequence."""
    g = gen(s)
    x = torch.randint(1, 20, (n, length), generator=g)
    query = x[:, :1]
    x[:, 1:] = torch.where(x[:, 1:] == query, (query % 19) + 1, x[:, 1:])       # no accidental repeats
    y = torch.randint(0, 2, (n,), generator=g)
    where = torch.randint(1, length, (n,), generator=g)
    x[torch.arange(n)[y == 1], where[y == 1]] = query[y == 1, 0]
    return x, y


class MotifAttention(nn.Module):
    def __init__(self, fixed: bool):
        super().__init__()
        self.tok = nn.Embedding(20, 32)
        self.pos = nn.Embedding(12, 32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True) if fixed else nn.MultiheadAttention(32, 4)
        self.norm = nn.LayerNorm(32)
        self.ff = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        self.head = nn.Linear(32, 2)

    def forward(self, x):                       # (batch, seq)
        h = self.tok(x) + self.pos(torch.arange(x.size(1), device=x.device))
        a, _ = self.attn(h, h, h)
        h = self.norm(h + a)
        h = h + self.ff(h)
        return self.head(h[:, 0])


@case("shapes_attention_over_batch_axis", "shapes",
      "nn.MultiheadAttention is built with its default batch_first=False but called on (batch, seq, embed) "
      "tensors, so it reads dim 0 as the sequence: each position attends over the other sequences in the batch at "
      "the same position, never over its own sequence, and the 'does the first token repeat' signal cannot be seen.",
      r"batch_first|\(seq(_len)?, ?batch|\(L, ?N, ?E\)|sequence[- ]first|seq[- ]first|attend\w* (across|over) the batch"
      r"|across (the )?(samples|sequences) in the batch|MultiheadAttention")
def build_motif(fixed: bool = False) -> dict:
    seed(0)
    x, y = repeat_motif(2400, 4)
    model = MotifAttention(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tensors(x[:2000], y[:2000]), 64),
                val_loader=loader(tensors(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("shapes_attention_over_batch_axis", fixed_of(build_motif), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# Part-of-speech-like tagger on a seq-first GRU: time-major logits flattened against batch-major tags.
# Source: https://github.com/IBM/pytorch-seq2seq/issues/34


def tag_data(n: int, s: int, length: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(s)
    tokens = torch.randint(1, 41, (n, length), generator=g)
    prev = torch.cat([torch.zeros(n, 1, dtype=torch.long), tokens[:, :-1]], 1)
    return tokens, (tokens + 2 * prev) % 5


class SeqFirstTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(41, 32)
        self.gru = nn.GRU(32, 64)              # sequence-first, as the tutorial it came from
        self.out = nn.Linear(64, 5)

    def forward(self, tokens):                 # (batch, time) -> logits (time, batch, 5)
        h, _ = self.gru(self.emb(tokens.t()))
        return self.out(h)


def tagger_loss(fixed: bool):
    def loss_fn(model, batch):
        tokens, tags = batch
        logits = model(tokens)
        if fixed:
            return F.cross_entropy(logits.reshape(-1, 5), tags.t().reshape(-1))
        return F.cross_entropy(logits.view(-1, 5), tags.view(-1))
    return loss_fn


@case("shapes_tagger_time_major_vs_batch_major", "shapes",
      "The seq-first GRU tagger returns (time, batch, 5) logits and the loss does logits.view(-1, 5) against "
      "tags.view(-1) with tags shaped (batch, time): the logits are flattened time-major and the targets "
      "batch-major, so row t*B + b is scored against the tag of another sentence at another position.",
      r"time[- ]major|batch[- ]major|flatten\w*|\(time, ?batch|\(seq(_len)?, ?batch|\(T, ?B|transpose|\.t\(\)"
      r"|permute|order of (the )?(dims|dimensions|axes)|misalign")
def build_tagger(fixed: bool = False) -> dict:
    seed(0)
    tokens, tags = tag_data(2560, 5)
    model = SeqFirstTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tensors(tokens[:2048], tags[:2048]), 32, drop_last=True),
                val_loader=loader(tensors(tokens[2048:], tags[2048:]), 128, shuffle=False),
                loss_fn=tagger_loss(fixed), max_steps=300)


fix("shapes_tagger_time_major_vs_batch_major", fixed_of(build_tagger),
    acc_of(lambda m, b: (m(b[0]).permute(1, 0, 2).argmax(-1), b[1])), "val token accuracy")
