"""Set bf's case registry: set a's Case / CaseTable, this set's case table, the shared synthetic graph and
recommender data, and the one-line fixes ``verify.py`` trains next to each broken case (``FIXES``)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight.fixes import FixTable
from benchmarks.blind_preflight.registry import CaseTable, gen, loader, mean_over, seed, twin  # noqa: F401

TABLE = CaseTable.by_family("benchmarks.blind_preflight_bf")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


# ---------------------------------------------------------------- one graph, node classification (SBM)
def sbm(n=300, c=4, p_in=0.08, p_out=0.004, d=16, feat_signal=0.3, s=0, sort_by_class=True):
    """Stochastic block model: nodes stored ordered by class (as generated); weak features, strong structure.
    Returns x (n, d), symmetric 0/1 adj (n, n) without self loops, y (n,)."""
    g = gen(s)
    y = torch.arange(n) * c // n if sort_by_class else torch.randint(0, c, (n,), generator=g)
    same = y[:, None] == y[None, :]
    prob = torch.where(same, torch.tensor(p_in), torch.tensor(p_out))
    upper = (torch.rand(n, n, generator=g) < prob).float().triu(1)
    adj = upper + upper.T
    centers = torch.randn(c, d, generator=g)
    x = feat_signal * centers[y] + torch.randn(n, d, generator=g)
    return x, adj, y


def node_split(n, s=0, frac=0.5):
    perm = torch.randperm(n, generator=gen(s + 7))
    k = int(frac * n)
    return perm[:k], perm[k:]


def node_loaders(y, train_idx, val_idx, batch_size=64):
    return (loader(TensorDataset(train_idx, y[train_idx]), batch_size),
            loader(TensorDataset(val_idx, y[val_idx]), 256, shuffle=False))


def on(model, batch):
    """The batch's tensors on the model's device (the loaders stay on the CPU)."""
    dev = next(model.parameters()).device
    return [t.to(dev) for t in batch]


def node_ce(model, batch):
    batch = on(model, batch)
    idx, t = batch
    return nn.functional.cross_entropy(model()[idx], t)


def node_acc(model, kw):
    return mean_over(model, kw["val_loader"], lambda m, b: ((m()[b[0]].argmax(-1) == b[1]).sum(), len(b[1])))


def gcn_norm(adj_with_loops):
    d = adj_with_loops.sum(1).clamp(min=1).pow(-0.5)
    return d[:, None] * adj_with_loops * d[None, :]


class DenseGCN(nn.Module):
    """Two-layer GCN over a fixed, precomputed normalised adjacency held as a buffer."""

    def __init__(self, x, a_hat, c, h=32):
        super().__init__()
        self.register_buffer("x", x)
        self.register_buffer("a", a_hat)
        self.l1, self.l2 = nn.Linear(x.shape[1], h), nn.Linear(h, c)

    def forward(self):
        h = torch.relu(self.a @ self.l1(self.x))
        return self.a @ self.l2(h)


# ---------------------------------------------------------------- recommender data
def latent_prefs(n_users=200, n_items=300, k=4, s=0):
    """True user / item factors; the affinity matrix (users, items)."""
    g = gen(s)
    pu, qi = torch.randn(n_users, k, generator=g), torch.randn(n_items, k, generator=g)
    return pu, qi, pu @ qi.T


def ratings(n_users=200, n_items=300, n=3000, s=0, bias_scale=1.0, noise=0.1):
    """Explicit ratings: dot of true factors plus user and item biases; (u, i, r) train / val tensors."""
    g = gen(s)
    pu, qi, aff = latent_prefs(n_users, n_items, 4, s)
    bu, bi = bias_scale * torch.randn(n_users, generator=g), bias_scale * torch.randn(n_items, generator=g)
    u, i = torch.randint(0, n_users, (n,), generator=g), torch.randint(0, n_items, (n,), generator=g)
    r = 0.5 * aff[u, i] + bu[u] + bi[i] + noise * torch.randn(n, generator=g)
    k = int(0.8 * n)
    return (u[:k], i[:k], r[:k]), (u[k:], i[k:], r[k:])


def implicit(n_users=100, n_items=400, per_user=12, s=0):
    """Implicit feedback: each user's positives are its top items under the true affinity; the last positive of
    each user is held out. Returns train (u, i) pairs, val (u, i) pairs, the per-user positive sets."""
    _, _, aff = latent_prefs(n_users, n_items, 4, s)
    top = aff.topk(per_user, dim=1).indices
    perm = torch.stack([torch.randperm(per_user, generator=gen(s + 1 + u)) for u in range(n_users)])
    top = top.gather(1, perm)
    users = torch.arange(n_users)[:, None].expand(-1, per_user)
    tr_u, tr_i = users[:, :-1].reshape(-1), top[:, :-1].reshape(-1)
    va_u, va_i = users[:, -1], top[:, -1]
    seen = torch.zeros(n_users, n_items, dtype=torch.bool)
    seen[tr_u, tr_i] = True
    return (tr_u, tr_i), (va_u, va_i), seen


def hit_at(k, score_all):
    """Hit rate@k of the held-out positive among all items, train positives masked: score_all(model, users)."""
    def metric(model, kw):
        seen = kw["val_loader"].seen  # the train positives, kept on the loader (not a run_preflight keyword)

        def fn(m, b):
            u, i = b[0], b[1]
            s = score_all(m, u).float().masked_fill(seen[u], -1e9)
            top = s.topk(k, dim=1).indices
            return (top == i[:, None]).any(1).sum(), len(u)
        return mean_over(model, kw["val_loader"], fn)
    return metric


def rmse(pred):
    def metric(model, kw):
        def fn(m, b):
            p = pred(m, b).reshape(-1).float()
            return ((p - b[-1].float()) ** 2).sum(), b[-1].numel()
        return math.sqrt(mean_over(model, kw["val_loader"], fn))
    return metric


class BPRPairs(Dataset):
    """(user, positive, sampled negative) triples; the negative is drawn afresh on every access."""

    def __init__(self, u, i, n_items, neg_high=None, reseed=False):
        self.u, self.i, self.n_items = u, i, n_items
        self.neg_high = neg_high or n_items
        self.reseed = reseed
        self.g = torch.Generator().manual_seed(99)

    def __len__(self):
        return len(self.u)

    def __getitem__(self, k):
        g = torch.Generator().manual_seed(0) if self.reseed else self.g
        return self.u[k], self.i[k], torch.randint(0, self.neg_high, (), generator=g)


def bpr_loss(model, batch):
    batch = on(model, batch)
    u, p, n = batch
    return -nn.functional.logsigmoid(model.score(u, p) - model.score(u, n)).mean()


class MF(nn.Module):
    def __init__(self, n_users, n_items, d=16, biases=False):
        super().__init__()
        self.user, self.item = nn.Embedding(n_users, d), nn.Embedding(n_items, d)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)
        self.biases = biases
        if biases:
            self.bu, self.bi = nn.Embedding(n_users, 1), nn.Embedding(n_items, 1)
            nn.init.zeros_(self.bu.weight)
            nn.init.zeros_(self.bi.weight)
            self.mu = nn.Parameter(torch.zeros(()))

    def score(self, u, i):
        s = (self.user(u) * self.item(i)).sum(-1)
        if self.biases:
            s = s + self.bu(u).squeeze(-1) + self.bi(i).squeeze(-1) + self.mu
        return s

    def score_all(self, u):
        s = self.user(u) @ self.item.weight.T
        return s + self.bi.weight.T if self.biases else s


def mse_triples(model, batch):
    batch = on(model, batch)
    u, i, r = batch
    return nn.functional.mse_loss(model.score(u, i), r)


# ---------------------------------------------------------------- mini-batched graphs (graph classification)
def small_graphs(n_graphs=600, n=10, s=0):
    """Graphs of n nodes with 2 colours (balanced); label 1: homophilous edges, 0: heterophilous edges. Node
    features alone carry no label; the label is only in how colours are wired."""
    g = gen(s)
    out = []
    for k in range(n_graphs):
        col = torch.randperm(n, generator=g) % 2
        y = k % 2
        same = col[:, None] == col[None, :]
        p = torch.where(same, torch.tensor(0.6 if y else 0.1), torch.tensor(0.1 if y else 0.6))
        up = (torch.rand(n, n, generator=g) < p).triu(1)
        src, dst = up.nonzero(as_tuple=True)
        ei = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], 1)
        x = torch.nn.functional.one_hot(col, 2).float()
        out.append({"x": x, "edge_index": ei, "y": y})
    return out


class GraphList(Dataset):
    def __init__(self, graphs):
        self.graphs = graphs

    def __len__(self):
        return len(self.graphs)

    def __getitem__(self, k):
        return self.graphs[k]


def collate_graphs(batch, offset=True, interleave=True, sort_labels=False):
    """Concatenate graphs into one big disconnected graph: x, edge_index (node ids offset per graph), the batch
    vector (graph id per node), labels."""
    xs, eis, start = [], [], 0
    for gph in batch:
        xs.append(gph["x"])
        eis.append(gph["edge_index"] + (start if offset else 0))
        start += gph["x"].shape[0]
    n = batch[0]["x"].shape[0]
    g = torch.arange(len(batch))
    bvec = g.repeat_interleave(n) if interleave else g.repeat(n)
    ys = [gph["y"] for gph in (sorted(batch, key=lambda b: b["edge_index"].shape[1]) if sort_labels else batch)]
    return torch.cat(xs), torch.cat(eis, 1), bvec, torch.tensor(ys)


class GraphNet(nn.Module):
    """Message passing with index_add_ over edge_index, then [self, neighbour-mean] MLP, then pooling."""

    def __init__(self, d=2, h=32, pool="mean", pool_in_place=True):
        super().__init__()
        self.inp = nn.Linear(d, h)
        self.mlp = nn.Sequential(nn.Linear(2 * h, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU())
        self.head = nn.Linear(h, 2)
        self.pool, self.pool_in_place = pool, pool_in_place

    def forward(self, x, ei, bvec):
        h = self.inp(x)
        src, dst = ei
        agg = torch.zeros_like(h).index_add_(0, dst, h[src])
        deg = h.new_zeros(h.shape[0]).index_add_(0, dst, h.new_ones(src.shape[0])).clamp(min=1)
        h = self.mlp(torch.cat([h, agg / deg[:, None]], -1))
        G = int(bvec.max()) + 1
        pooled = h.new_zeros(G, h.shape[1])
        if self.pool_in_place:
            pooled.index_add_(0, bvec, h)
        else:
            pooled.index_add(0, bvec, h)
        cnt = h.new_zeros(G).index_add_(0, bvec, h.new_ones(h.shape[0])).clamp(min=1)
        return self.head(pooled / cnt[:, None])


def graph_ce(model, batch):
    batch = on(model, batch)
    x, ei, b, y = batch
    return nn.functional.cross_entropy(model(x, ei, b), y)


def graph_acc(model, kw):
    """Accuracy on the validation graphs, collated by the case's own collate_fn (as the user evaluates)."""
    return mean_over(model, kw["val_loader"],
                     lambda m, b: ((m(b[0], b[1], b[2]).argmax(-1) == b[3]).sum(), len(b[3])))


def graph_loaders(collate, s=0, n_graphs=600):
    """Train and validation loaders with the same collate_fn."""
    gs = small_graphs(n_graphs, s=s)
    k = int(0.75 * n_graphs)
    val = loader(GraphList(gs[k:]), 64, shuffle=False, collate_fn=collate)
    return loader(GraphList(gs[:k]), 32, collate_fn=collate), val
