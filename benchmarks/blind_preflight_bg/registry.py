"""Set bg's case registry (self-supervised / contrastive learning and CTC): set a's Case / CaseTable, its own case
table, the one-line fixes ``verify.py`` trains next to each broken case (``FIXES``), and the shared data and models."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from benchmarks.blind_preflight.fixes import FixTable
from benchmarks.blind_preflight.registry import CaseTable, gen, loader, seed, twin  # noqa: F401

TABLE = CaseTable.by_family("benchmarks.blind_preflight_bg")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


# ---------------------------------------------------------------- self-supervised data: signal + nuisance, rotated
SIG, NUIS = 24, 16
DIN = SIG + NUIS


def latent_signal(n: int, s: int = 0, classes: int = 0):
    """(signal rows (n, SIG), class ids or None): a nonlinear map of an 8-d latent (clustered when classes > 0)."""
    g = gen(s)
    a = torch.randn(8, SIG, generator=gen(99)) / 8 ** 0.5
    if classes:
        centers = torch.randn(classes, 8, generator=gen(98)) * 1.2
        y = torch.randint(0, classes, (n,), generator=g)
        z = centers[y] + 0.5 * torch.randn(n, 8, generator=g)
    else:
        y, z = None, torch.randn(n, 8, generator=g)
    return torch.tanh(z @ a) * 1.5, y


ROT = torch.linalg.qr(torch.randn(DIN, DIN, generator=gen(97)))[0]


def augment(sig: torch.Tensor, g: torch.Generator | None = None) -> torch.Tensor:
    """One random view: the signal jittered, fresh nuisance dims, all rotated by a fixed orthogonal matrix."""
    shape = sig.shape[:-1]
    s = sig * (1 + 0.1 * torch.randn(*shape, SIG, generator=g)) + 0.6 * torch.randn(*shape, SIG, generator=g)
    nu = 1.5 * torch.randn(*shape, NUIS, generator=g)
    return torch.cat([s, nu], -1) @ ROT


class TwoViews(Dataset):
    def __init__(self, sig):
        self.sig = sig

    def __len__(self):
        return len(self.sig)

    def __getitem__(self, i):
        return augment(self.sig[i]), augment(self.sig[i])


def val_views(n: int = 256, s: int = 5):
    sig, _ = latent_signal(n, s)
    return augment(sig, gen(s + 1)), augment(sig, gen(s + 2))


def mlp(a, h, b):
    return nn.Sequential(nn.Linear(a, h), nn.ReLU(), nn.Linear(h, b))


class SSLNet(nn.Module):
    """encoder (the representation the metric reads) + projector (+ predictor)."""

    def __init__(self, predictor: bool = False, d: int = 32, p: int = 16):
        super().__init__()
        self.encoder = mlp(DIN, 64, d)
        self.projector = nn.Sequential(nn.Linear(d, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, p))
        self.predictor = mlp(p, 32, p) if predictor else None

    def forward(self, x):
        return self.encoder(x)

    def project(self, x):
        return self.projector(self.encoder(x))


@torch.no_grad()
def retrieval_top1(model, kw) -> float:
    """Fraction of validation samples whose nearest other view (cosine, encoder features) is their own pair."""
    was = model.training
    model.eval()
    a, b = kw["val_views"]
    fa, fb = F.normalize(model(a), dim=1), F.normalize(model(b), dim=1)
    model.train(was)
    return ((fa @ fb.T).argmax(1) == torch.arange(len(a))).float().mean().item()


@torch.no_grad()
def knn_accuracy(model, kw) -> float:
    """1-NN class accuracy of validation rows against the training rows (cosine, encoder features)."""
    was = model.training
    model.eval()
    xtr, ytr, xva, yva = kw["knn_data"]
    ftr, fva = F.normalize(model(xtr), dim=1), F.normalize(model(xva), dim=1)
    model.train(was)
    return (ytr[(fva @ ftr.T).argmax(1)] == yva).float().mean().item()


def nt_xent(z1, z2, t: float = 0.2):
    b = z1.size(0)
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = (z @ z.T / t).masked_fill(torch.eye(2 * b, dtype=torch.bool), -1e9)
    return F.cross_entropy(sim, (torch.arange(2 * b) + b) % (2 * b))


def ssl_kwargs(model, loss_fn, train_sig, params=None, lr=3e-3, batch_size=64, **extra):
    params = model.parameters() if params is None else params
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=lr),
                train_loader=loader(TwoViews(train_sig), batch_size, drop_last=True),
                loss_fn=loss_fn, val_loader=loader(TwoViews(latent_signal(256, 5)[0]), batch_size, shuffle=False),
                val_views=val_views(), **extra)


# ---------------------------------------------------------------- CTC data: label segments of noisy frames
VOCAB, FEAT, TMAX, SMAX = 6, 12, 24, 5  # labels 1..VOCAB, blank 0
EMB = torch.randn(VOCAB + 1, FEAT, generator=gen(96)) * 1.5


def ctc_sequences(n: int, s: int = 0, zero_based: bool = False):
    """(frames (n, TMAX, FEAT) right-padded with zeros, input lengths, targets (n, SMAX) padded with 0, target
    lengths). Each label is 2-3 frames of its embedding + noise, followed by one frame of noise."""
    g = gen(s)
    x = torch.zeros(n, TMAX, FEAT)
    y = torch.zeros(n, SMAX, dtype=torch.long)
    xl, yl = torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    for i in range(n):
        L = int(torch.randint(2, SMAX + 1, (1,), generator=g))
        labs = torch.randint(1, VOCAB + 1, (L,), generator=g)
        t = 0
        for lab in labs.tolist():
            r = int(torch.randint(2, 4, (1,), generator=g))
            x[i, t:t + r] = EMB[lab] + 0.9 * torch.randn(r, FEAT, generator=g)
            t += r
            x[i, t] = 0.4 * torch.randn(FEAT, generator=g)
            t += 1
        xl[i], yl[i] = t, L
        y[i, :L] = labs - 1 if zero_based else labs
    return x, xl, y, yl


class CTCSet(Dataset):
    def __init__(self, x, xl, y, yl):
        self.t = (x, xl, y, yl)

    def __len__(self):
        return len(self.t[0])

    def __getitem__(self, i):
        return tuple(a[i] for a in self.t)


class CTCNet(nn.Module):
    """Conv1d front end + bidirectional GRU + per-frame classifier; returns (B, T', C) log-probs."""

    def __init__(self, stride: int = 1, classes: int = VOCAB + 1):
        super().__init__()
        self.conv = nn.Conv1d(FEAT, 48, 3, stride=stride, padding=1)
        self.rnn = nn.GRU(48, 32, batch_first=True, bidirectional=True)
        self.out = nn.Linear(64, classes)

    def forward(self, x):
        h = F.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        return F.log_softmax(self.out(self.rnn(h)[0]), dim=-1)


def greedy(logp: torch.Tensor, lengths, blank: int = 0, shift: int = 0):
    """Greedy CTC decoding of (B, T, C) log-probs: argmax, merge repeats, drop blanks (labels + shift)."""
    out = []
    for row, n in zip(logp.argmax(-1), lengths):
        seq, prev = [], None
        for k in row[:int(n)].tolist():
            if k != prev and k != blank:
                seq.append(k + shift)
            prev = k
        out.append(seq)
    return out


def ctc_exact_match(blank: int = 0, shift: int = 0, lengths_of=None):
    """Validation sequence accuracy of greedy decoding (exact match with the true labels 1..VOCAB)."""
    @torch.no_grad()
    def metric(model, kw):
        was = model.training
        model.eval()
        x, xl, y, yl = kw["val_data"]
        logp = model(x)
        lens = xl if lengths_of is None else lengths_of(xl, logp.size(1))
        dec = greedy(logp, lens, blank, shift)
        model.train(was)
        right = sum(d == y[i, :yl[i]].tolist() for i, d in enumerate(dec))
        return right / len(dec)
    return metric


def ctc_kwargs(model, loss_fn, data, lr=3e-3, batch_size=32, collate_fn=None, **extra):
    val = ctc_sequences(256, 11)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=lr),
                train_loader=loader(CTCSet(*data), batch_size, collate_fn=collate_fn),
                loss_fn=loss_fn, val_loader=loader(CTCSet(*val), batch_size, shuffle=False), val_data=val, **extra)


def ctc_step(model, batch):
    x, xl, y, yl = batch
    return F.ctc_loss(model(x).transpose(0, 1), y, xl, yl, blank=0)
