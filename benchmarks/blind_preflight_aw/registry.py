"""Set aw's case registry: set a's Case / CaseTable and data helpers, this set's synthetic graph, audio and volume
data, its own case table, and the one-line fixes ``verify.py`` trains next to each broken case (``FIXES``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_aw")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


# ----------------------------------------------------------------------------------------------------------- graphs
def make_graphs(n: int, s: int = 0, types: int = 4, extra: int = 4):
    """Small random undirected graphs: node features = one-hot atom type + noise channels; edge_index (2, E) with both
    directions, local node ids. Targets: ``pairs`` = number of type-0/type-1 bonds (needs message passing),
    ``cls`` = pairs above the median."""
    g = gen(s)
    graphs = []
    for _ in range(n):
        nn_ = int(torch.randint(6, 15, (1,), generator=g))
        t = torch.randint(0, types, (nn_,), generator=g)
        x = torch.cat([F.one_hot(t, types).float(), 0.3 * torch.randn(nn_, extra, generator=g)], 1)
        a = (torch.rand(nn_, nn_, generator=g) < 0.3).triu(1)
        src, dst = a.nonzero(as_tuple=True)
        ei = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
        pairs = ((t[src] == 0) & (t[dst] == 1)) | ((t[src] == 1) & (t[dst] == 0))
        graphs.append(dict(x=x, edge_index=ei, pairs=float(pairs.sum()), n=nn_))
    med = sorted(gr["pairs"] for gr in graphs)[n // 2]
    for gr in graphs:
        gr["cls"] = int(gr["pairs"] >= med)
    return graphs


def collate_graphs(items, key="cls"):
    """Hand-written PyG-style collate: concatenated nodes, edge_index shifted by the node offset, batch vector."""
    xs, eis, batch, ys, off = [], [], [], [], 0
    for i, gr in enumerate(items):
        xs.append(gr["x"])
        eis.append(gr["edge_index"] + off)
        batch.append(torch.full((gr["n"],), i, dtype=torch.long))
        ys.append(gr[key])
        off += gr["n"]
    y = torch.tensor(ys) if key == "cls" else torch.tensor(ys, dtype=torch.float)
    return torch.cat(xs), torch.cat(eis, 1), torch.cat(batch), y


class SumGNN(nn.Module):
    """GIN-like message passing (index_add_ over edge_index[1]) and sum pooling over the batch vector."""

    def __init__(self, f_in=8, hidden=32, out=2, layers=2):
        super().__init__()
        self.inp = nn.Linear(f_in, hidden)
        self.convs = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
                                   for _ in range(layers))
        self.readout = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out))

    def forward(self, x, edge_index, batch):
        h = torch.relu(self.inp(x))
        src, dst = edge_index
        for conv in self.convs:
            agg = torch.zeros_like(h).index_add_(0, dst, h[src])
            h = torch.relu(conv(h + agg))
        g = torch.zeros(int(batch.max()) + 1, h.size(1), device=h.device).index_add_(0, batch, h)
        return self.readout(g / 10)


def graph_acc(model, kw):
    def fn(m, b):
        x, ei, bt, y = b
        return (m(x, ei, bt).argmax(-1) == y).sum().item(), y.numel()
    return mean_over(model, kw["val_loader"], fn)


def graph_rmse(model, kw):
    def fn(m, b):
        x, ei, bt, y = b
        return ((m(x, ei, bt).reshape(-1) - y) ** 2).sum().item(), y.numel()
    return math.sqrt(mean_over(model, kw["val_loader"], fn))


# ------------------------------------------------------------------------------------------------------------ audio
N_FFT, HOP, SIG_LEN = 128, 64, 2048


def harmonic(g, n, f0_lo, f0_hi, length=SIG_LEN):
    """Voiced-like sources: a random pitch with 4 harmonics and a slow amplitude envelope."""
    t = torch.arange(length).float()
    f0 = f0_lo + (f0_hi - f0_lo) * torch.rand(n, 1, generator=g)
    sig = sum(torch.sin(2 * math.pi * k * f0 * t / 8000 + 6.28 * torch.rand(n, 1, generator=g)) / k
              for k in range(1, 5))
    env = 0.6 + 0.4 * torch.sin(2 * math.pi * t / length * (1 + 2 * torch.rand(n, 1, generator=g)))
    return sig * env


def noisy_clean(n: int, s: int = 0, snr_noise: float = 1.0):
    g = gen(s)
    clean = harmonic(g, n, 100, 400)
    noise = snr_noise * torch.randn(n, SIG_LEN, generator=g)
    return clean + noise, clean


def two_speakers(n: int, s: int = 0):
    """Mixtures of a low-pitched and a high-pitched source, stacked in random order (the order carries no meaning)."""
    g = gen(s)
    low, high = harmonic(g, n, 90, 160), harmonic(g, n, 600, 900)
    swap = torch.rand(n, generator=g) < 0.5
    first = torch.where(swap[:, None], high, low)
    second = torch.where(swap[:, None], low, high)
    return low + high, torch.stack([first, second], 1)


def stft(x):
    return torch.stft(x, N_FFT, HOP, window=torch.hann_window(N_FFT, device=x.device), return_complex=True)


def istft(spec, length=SIG_LEN):
    return torch.istft(spec, N_FFT, HOP, window=torch.hann_window(N_FFT, device=spec.device), length=length)


def si_snr(est, ref, eps=1e-8):
    """Scale-invariant SNR in dB over the last (time) axis."""
    est = est - est.mean(-1, keepdim=True)
    ref = ref - ref.mean(-1, keepdim=True)
    proj = (est * ref).sum(-1, keepdim=True) / (ref.pow(2).sum(-1, keepdim=True) + eps) * ref
    noise = est - proj
    return 10 * torch.log10(proj.pow(2).sum(-1) / (noise.pow(2).sum(-1) + eps) + eps)


class FrameMasker(nn.Module):
    """Per-frame MLP on the log-magnitude (B, T, F) -> sigmoid masks (B, T, F * sources)."""

    def __init__(self, freqs=N_FFT // 2 + 1, hidden=128, sources=1):
        super().__init__()
        self.sources = sources
        self.net = nn.Sequential(nn.Linear(freqs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, freqs * sources))

    def forward(self, logmag):  # (B, T, F)
        return torch.sigmoid(self.net(logmag))


def enhance(model, noisy):
    """noisy (B, L) -> estimate (B, L): mask on the magnitude, noisy phase, inverse STFT."""
    spec = stft(noisy)                               # (B, F, T)
    feat = torch.log1p(spec.abs()).transpose(1, 2)   # (B, T, F)
    mask = model(feat).transpose(1, 2)               # (B, F, T)
    return istft(spec * mask)


class Enhancer(nn.Module):
    """noisy waveform (B, L) -> enhanced waveform (B, L) through a FrameMasker."""

    def __init__(self, masker=None):
        super().__init__()
        self.masker = masker or FrameMasker()

    def forward(self, noisy):
        return enhance(self.masker, noisy)


class Separator(nn.Module):
    """mixture (B, L) -> two estimates (B, 2, L)."""

    def __init__(self):
        super().__init__()
        self.masker = FrameMasker(sources=2)

    def forward(self, mix):
        return separate(self.masker, mix)


def val_si_snr(fwd=lambda m, x: m(x)):
    def metric(model, kw):
        def fn(m, b):
            noisy, clean = b
            return si_snr(fwd(m, noisy), clean).sum().item(), clean.size(0)
        return mean_over(model, kw["val_loader"], fn)
    return metric


def separate(model, mix):
    """mix (B, L) -> two estimates (B, 2, L)."""
    spec = stft(mix)
    feat = torch.log1p(spec.abs()).transpose(1, 2)
    masks = model(feat)                              # (B, T, 2F)
    b, t, _ = masks.shape
    masks = masks.reshape(b, t, 2, -1).permute(0, 2, 3, 1)  # (B, 2, F, T)
    return istft((spec[:, None] * masks).flatten(0, 1)).reshape(b, 2, -1)


def pit_si_snr(est, ref):
    """Per-utterance best of the two assignments (B,)."""
    a = (si_snr(est[:, 0], ref[:, 0]) + si_snr(est[:, 1], ref[:, 1])) / 2
    b = (si_snr(est[:, 0], ref[:, 1]) + si_snr(est[:, 1], ref[:, 0])) / 2
    return torch.maximum(a, b)


def val_pit_si_snr(model, kw):
    def fn(m, b):
        mix, refs = b
        return pit_si_snr(m(mix), refs).sum().item(), mix.size(0)
    return mean_over(model, kw["val_loader"], fn)


# ---------------------------------------------------------------------------------------------------------- volumes
VOL = 16


def make_volumes(n: int, s: int = 0, size: int = VOL, classes: int = 2, r_lo: float = 2.0, r_hi: float = 4.0):
    """CT-like volumes (n, 1, D, H, W) in Hounsfield-ish units scaled to ~N(0,1) noise with 1-2 brighter spheres;
    label map (n, D, H, W): 0 background, 1 sphere (and 2 for a second, darker sphere when classes == 3)."""
    g = gen(s)
    zz, yy, xx = torch.meshgrid(*(torch.arange(size).float(),) * 3, indexing="ij")
    vols = torch.randn(n, size, size, size, generator=g)
    labels = torch.zeros(n, size, size, size, dtype=torch.long)
    for i in range(n):
        for c in range(1, classes):
            for _ in range(int(torch.randint(1, 3, (1,), generator=g))):
                cz, cy, cx = (3 + (size - 6) * torch.rand(3, generator=g)).tolist()
                r = r_lo + (r_hi - r_lo) * float(torch.rand(1, generator=g))
                inside = (zz - cz) ** 2 + (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
                labels[i][inside] = c
                vols[i][inside] += 1.5 if c == 1 else -1.5
    return vols[:, None], labels


class SmallSeg3d(nn.Module):
    def __init__(self, out=1, width=8):
        super().__init__()
        self.body = nn.Sequential(nn.Conv3d(1, width, 3, padding=1), nn.ReLU(),
                                  nn.Conv3d(width, width, 3, padding=1), nn.ReLU())
        self.head = nn.Conv3d(width, out, 1)

    def forward(self, x):
        return self.head(self.body(x))


def dice_score(pred_fg, true_fg):
    """Foreground Dice over a batch of boolean volumes."""
    inter = (pred_fg & true_fg).sum().item()
    return inter, (pred_fg.sum().item() + true_fg.sum().item()) / 2


def val_dice(fwd=None, fg=1):
    """Mean foreground Dice (pooled over voxels) on val_loader; fwd(model, batch) -> (pred_fg, true_fg) booleans."""
    def default(m, b):
        x, y = b
        out = m(x)
        pred = out[:, 0] > 0 if out.size(1) == 1 else out.argmax(1) == fg
        return pred, y == fg

    def metric(model, kw):
        def fn(m, b):
            p, t = (fwd or default)(m, b)
            return dice_score(p, t)
        return mean_over(model, kw["val_loader"], fn)
    return metric
