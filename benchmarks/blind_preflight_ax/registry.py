"""Set ax's case registry (tabular deep learning and ranking): set a's Case / CaseTable and data helpers, its own
case table, the one-line fixes ``verify.py`` trains next to each broken case (``FIXES``) and shared data makers."""

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
    twin,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_ax")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def acc_of(fwd):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels)."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            return (p == y).sum().item(), y.numel()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def rmse_of(fwd):
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            return ((p.reshape(-1).float() - y.reshape(-1).float()) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


def tabular(n: int, vocab: tuple[int, ...] = (50, 20, 8), d_num: int = 4, s: int = 0, cat_weight=1.5):
    """Categorical ids (n, len(vocab)), numeric features (n, d_num) and a binary label from a teacher in which every
    category has its own effect plus one pairwise cross of the first two fields."""
    g = gen(s)
    cats = torch.stack([torch.randint(0, v, (n,), generator=g) for v in vocab], 1)
    nums = torch.randn(n, d_num, generator=g)
    weights = cat_weight if isinstance(cat_weight, tuple) else (cat_weight,) * len(vocab)
    effects = [torch.randn(v, generator=g) * w_ for v, w_ in zip(vocab, weights)]
    cross = torch.randn(vocab[0], vocab[1], generator=g)
    w = torch.randn(d_num, generator=g)
    logit = sum(e[cats[:, i]] for i, e in enumerate(effects)) + cross[cats[:, 0], cats[:, 1]] + nums @ w
    y = (logit > logit.median()).float()
    return cats, nums, y


def ltr(n_q: int, n_d: int = 10, d: int = 8, s: int = 0):
    """Query groups: features (n_q, n_d, d), relevance grades 0..4 (n_q, n_d) from a nonlinear teacher."""
    g = gen(s)
    x = torch.randn(n_q, n_d, d, generator=g)
    w = torch.randn(d, generator=g)
    score = x @ w + 0.5 * torch.tanh(x[..., 0] * x[..., 1])
    ranks = score.argsort(1).argsort(1).float()            # 0 = worst in its query
    grades = (ranks * 5 / n_d).floor().clamp(max=4)
    return x, grades


def top1_metric(score_fn):
    """Fraction of validation queries whose top-scored document has the query's best grade."""
    def metric(model, kw):
        def fn(m, b):
            x, g = b[0], b[-1]
            s = score_fn(m, x)
            top = s.argmax(1)
            return (g.gather(1, top[:, None]).squeeze(1) == g.max(1).values).sum().item(), g.shape[0]
        return mean_over(model, kw["val_loader"], fn)
    return metric


def clusters(n: int, n_cls: int = 20, d: int = 16, s: int = 0, noise: float = 1.0):
    """Metric-learning data: class centres pushed through a fixed random nonlinearity, plus noise."""
    g = gen(s)
    centres = torch.randn(n_cls, d, generator=g) * 1.5
    y = torch.randint(0, n_cls, (n,), generator=g)
    x = centres[y] + noise * torch.randn(n, d, generator=g)
    mix = torch.randn(d, d, generator=g) / d ** 0.5
    return torch.tanh(x @ mix) + 0.3 * x, y


def recall_at_1(embed_fn=None):
    """Validation recall@1: the nearest other validation point (cosine) shares the label."""
    def metric(model, kw):
        was = model.training
        model.eval()
        xs, ys = zip(*[(b[0], b[-1]) for b in kw["val_loader"]])
        x, y = torch.cat(xs), torch.cat(ys)
        with torch.no_grad():
            e = F.normalize((embed_fn or (lambda m, v: m(v)))(model, x).float(), dim=1)
        sim = e @ e.t()
        sim.fill_diagonal_(-2)
        model.train(was)
        return (y[sim.argmax(1)] == y).float().mean().item()
    return metric


class PKSampler(torch.utils.data.Sampler):
    """Label-aware batch sampler: P classes x K samples per batch (seeded, endless-ish: ``n_batches`` per epoch)."""

    def __init__(self, labels: torch.Tensor, p: int, k: int, s: int = 0, n_batches: int = 50):
        self.by = [torch.nonzero(labels == c).squeeze(1) for c in labels.unique()]
        self.p, self.k, self.g, self.n = p, k, gen(s), n_batches

    def __len__(self):
        return self.n

    def __iter__(self):
        for _ in range(self.n):
            cls = torch.randperm(len(self.by), generator=self.g)[:self.p]
            yield torch.cat([self.by[int(c)][torch.randint(0, len(self.by[int(c)]), (self.k,), generator=self.g)]
                             for c in cls]).tolist()
