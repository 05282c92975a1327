"""Set w's case registry: set a's Case / CaseTable and data helpers, its own case table, the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved), and the metrics they are scored on."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

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

TABLE = CaseTable.by_family("benchmarks.blind_preflight_w")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def val_mean(fn):
    """Metric: the mean over the validation batches of fn(model, batch) -> (sum, count)."""
    def metric(model, kw):
        return mean_over(model, kw["val_loader"], fn)
    return metric


def rmse_of(fwd):
    """Validation RMSE with fwd(model, batch) -> (predictions, targets)."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


def acc_of(fwd):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels); -100 is skipped."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def knn_acc_of(embed, k: int = 5):
    """Leave-one-out k-NN accuracy (cosine) of embed(model, x) over the whole validation set, batches (x, y):
    how well a self-supervised encoder separates classes it never saw labels of."""
    @torch.no_grad()
    def metric(model, kw):
        was = model.training
        model.eval()
        feats, labels = [], []
        for x, y in kw["val_loader"]:
            dev = model_device(model)
            feats.append(F.normalize(embed(model, x.to(dev)).float(), dim=1).cpu())
            labels.append(y)
        model.train(was)
        f, y = torch.cat(feats), torch.cat(labels)
        sim = f @ f.T
        sim.fill_diagonal_(-float("inf"))
        idx = sim.topk(k, dim=1).indices
        votes = torch.nn.functional.one_hot(y[idx], int(y.max()) + 1).sum(1)
        return (votes.argmax(1) == y).float().mean().item()
    return metric


def wasserstein_1d(a: torch.Tensor, b: torch.Tensor) -> float:
    """W1 distance between two 1-D samples of equal size (sorted matching)."""
    a, b = a.reshape(-1).sort().values, b.reshape(-1).sort().values
    return (a - b).abs().mean().item()


def split(x, y, n_train):
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


# ---- synthetic data shared by several cases (data only: every case writes its own model, loss and loop code) ----

def sbm_graph(n: int, classes: int, dim: int, homophily: float, degree: float, signal: float, noise: float,
              s: int = 0) -> dict:
    """A node-classification graph: planted classes, undirected edges (both directions listed, sorted by source)
    with the given fraction inside a class, and node features = signal * class prototype + noise."""
    g = gen(s)
    y = torch.randint(0, classes, (n,), generator=g)
    protos = torch.randn(classes, dim, generator=g)
    x = signal * protos[y] + noise * torch.randn(n, dim, generator=g)
    m = int(n * degree / 2)
    src = torch.randint(0, n, (m,), generator=g)
    same = torch.rand(m, generator=g) < homophily
    dst = torch.empty(m, dtype=torch.long)
    by_class = [torch.nonzero(y == c).flatten() for c in range(classes)]
    for i in range(m):
        if same[i]:
            pool = by_class[int(y[src[i]])]
        else:
            pool = torch.nonzero(y != y[src[i]]).flatten()
        dst[i] = pool[torch.randint(0, len(pool), (1,), generator=g)]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    pairs = torch.cat([torch.stack([src, dst], 1), torch.stack([dst, src], 1)])
    pairs = pairs[pairs[:, 0].argsort(stable=True)]
    perm = torch.randperm(n, generator=g)
    train_mask = torch.zeros(n, dtype=torch.bool)
    val_mask = torch.zeros(n, dtype=torch.bool)
    train_mask[perm[: int(0.3 * n)]] = True
    val_mask[perm[int(0.5 * n):]] = True
    return dict(x=x, y=y, edges=pairs, train_mask=train_mask, val_mask=val_mask)


def view_data(n: int, classes: int, content: int, nuisance: int, nuisance_std: float, s: int = 0):
    """Vectors = (class content, large nuisance) rotated by a fixed orthogonal matrix Q: a good representation
    ignores the nuisance part. Returns x, y, Q (the augmentation perturbs the nuisance coordinates only)."""
    g = gen(s)
    y = torch.randint(0, classes, (n,), generator=g)
    protos = torch.randn(classes, content, generator=g) * 1.5
    c = protos[y] + 0.4 * torch.randn(n, content, generator=g)
    u = nuisance_std * torch.randn(n, nuisance, generator=g)
    q, _ = torch.linalg.qr(torch.randn(content + nuisance, content + nuisance, generator=g))
    return torch.cat([c, u], 1) @ q, y, q
