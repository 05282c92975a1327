"""Set ap's case registry: set a's Case / CaseTable and data helpers, its own case table, the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved), and the synthetic data and
metrics of this set (contrastive views, low-rank images, a small diffusion manifold, node-classification graphs)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from benchmarks.blind_preflight.fixes import FixTable, accuracy, val_acc  # noqa: F401
from benchmarks.blind_preflight.registry import (  # noqa: F401
    Case,
    CaseTable,
    gen,
    loader,
    mean_over,
    model_device,
    seed,
    teacher_classes,
    teacher_regression,
    token_sequences,
    twin,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_ap")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


# ---------------------------------------------------------------- contrastive views
N_CLASSES, D_CLS, D_NUIS = 6, 4, 20


class Views(Dataset):
    """Instances of 6 latent classes; the class lives in 4 dims, 20 nuisance dims are re-drawn by every
    augmentation (the thing a contrastive encoder must learn to ignore). Items: (view1, view2, label)."""

    def __init__(self, n: int, s: int, same_view: bool = False, nuis: float = 2.0):
        g = gen(s)
        proto = torch.randn(N_CLASSES, D_CLS, generator=gen(99)) * 1.5
        self.y = torch.randint(0, N_CLASSES, (n,), generator=g)
        self.base = proto[self.y] + 0.4 * torch.randn(n, D_CLS, generator=g)
        self.same_view, self.nuis = same_view, nuis

    def __len__(self):
        return len(self.y)

    def aug(self, b):
        return torch.cat([b + 0.15 * torch.randn(D_CLS), self.nuis * torch.randn(D_NUIS)])

    def __getitem__(self, i):
        v1 = self.aug(self.base[i])
        v2 = v1 if self.same_view else self.aug(self.base[i])
        return v1, v2, self.y[i]


def knn_of(embed=None):
    """Leave-one-out 1-NN accuracy (cosine) of the embeddings of the validation views' first view."""
    @torch.no_grad()
    def metric(model, kw):
        was = model.training
        model.eval()
        zs, ys = [], []
        for b in kw["val_loader"]:
            zs.append(embed(model, b[0]) if embed else model(b[0]))
            ys.append(b[-1])
        model.train(was)
        z, y = F.normalize(torch.cat(zs).float(), dim=1), torch.cat(ys)
        sim = z @ z.T
        sim.fill_diagonal_(-2)
        return (y[sim.argmax(1)] == y).float().mean().item()
    return metric


# ---------------------------------------------------------------- low-rank "images"
def lowrank_images(n: int, s: int, d: int = 64, k: int = 4) -> torch.Tensor:
    g = gen(s)
    w = torch.randn(k, d, generator=gen(77)) * 1.2
    return torch.sigmoid(torch.randn(n, k, generator=g) @ w)


def rmse_of(fwd):
    """Validation RMSE with fwd(model, batch) -> (predictions, targets) of any matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


# ---------------------------------------------------------------- diffusion
T_STEPS = 50


def betas():
    return torch.linspace(1e-3, 0.15, T_STEPS)


def alpha_bar():
    return torch.cumprod(1 - betas(), 0)


def manifold(n: int, s: int, d: int = 8) -> torch.Tensor:
    g = gen(s)
    a = torch.randn(2, d, generator=gen(55))
    return torch.tanh(torch.randn(n, 2, generator=g) @ a)


def eps_mse(model, kw):
    """Noise-prediction MSE on the validation batches under the correct (cumprod) schedule, fixed noise and t."""
    ab = alpha_bar()
    g = gen(5)

    def fn(m, b):
        x0 = b[0].float()
        t = torch.randint(0, T_STEPS, (len(x0),), generator=g)
        eps = torch.randn(x0.shape, generator=g)
        a = ab[t].view(-1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * eps
        return ((m(xt, t).float() - eps) ** 2).sum().item(), eps.numel()
    return mean_over(model, kw["val_loader"], fn)


# ---------------------------------------------------------------- graphs
def sbm_graph(n: int = 400, c: int = 4, d: int = 16, s: int = 0, same: int = 2, rand: int = 4, signal: float = 0.9):
    """Node features with a weak class signal, each node linked to `same` nodes of its class and `rand` random
    nodes (symmetric 0/1 adjacency, no self-loops). Returns x, adj, y, train/val boolean masks (40% / 30%)."""
    g = gen(s)
    y = torch.randint(0, c, (n,), generator=g)
    mu = torch.randn(c, d, generator=gen(31))
    x = signal * mu[y] + torch.randn(n, d, generator=g)
    adj = torch.zeros(n, n)
    for i in range(n):
        pool = (y == y[i]).nonzero().flatten()
        js = pool[torch.randint(0, len(pool), (same,), generator=g)]
        adj[i, js] = 1
        adj[i, torch.randint(0, n, (rand,), generator=g)] = 1
    adj = ((adj + adj.T) > 0).float()
    adj.fill_diagonal_(0)
    perm = torch.randperm(n, generator=g)
    train, val = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
    train[perm[: int(0.4 * n)]] = True
    val[perm[int(0.4 * n): int(0.7 * n)]] = True
    return x, adj, y, train, val


def graph_loader(*tensors) -> DataLoader:
    """A full-batch graph: the one (x, adj, y, mask) tuple every step."""
    return DataLoader([tuple(tensors)], batch_size=None)


def node_acc(model, kw):
    def fn(m, b):
        x, adj, y, mask = b
        pred = m(x, adj).argmax(-1)
        mask = mask.bool()
        return (pred[mask] == y[mask]).sum().item(), mask.sum().item()
    return mean_over(model, kw["val_loader"], fn)
