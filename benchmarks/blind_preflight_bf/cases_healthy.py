"""Healthy: five corrected twins of broken cases, and five unusual but correct setups of the domain."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_bf import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_bf.cases_trained import bpr_case
from benchmarks.blind_preflight_bf.registry import (
    MF,
    BPRPairs,
    GraphNet,
    collate_graphs,
    gen,
    graph_ce,
    graph_loaders,
    healthy,
    implicit,
    loader,
    node_ce,
    node_loaders,
    node_split,
    on,
    ratings,
    sbm,
    seed,
    twin,
)

for _builder, _desc in [
    (cases_shapes.gcn_self_loops_ones_vector, "GCN with self loops added as torch.eye(n)."),
    (cases_targets.two_tower_in_batch_labels_zero, "Two-tower in-batch softmax with torch.arange(B) targets."),
    (cases_mechanics.message_passing_scatter_to_source, "Edge-index mean aggregation scattered to dst."),
    (cases_data.bpr_negative_sampler_reseeded_per_item, "BPR with one negative generator kept across calls."),
    (cases_trained.mf_tables_from_pretrained_frozen, "BPR MF warm-started with from_pretrained(freeze=False)."),
]:
    healthy(_builder.__name__ + "_fixed", _desc)(twin(_builder))


class SparseGCN(nn.Module):
    """GCN over a torch.sparse COO adjacency with edge weights (symmetric normalisation)."""

    def __init__(self, x, a_sparse, c, h=32):
        super().__init__()
        self.register_buffer("x", x)
        self.register_buffer("a", a_sparse)
        self.l1, self.l2 = nn.Linear(x.shape[1], h), nn.Linear(h, c)

    def forward(self):
        h = torch.relu(torch.sparse.mm(self.a, self.l1(self.x)))
        return torch.sparse.mm(self.a, self.l2(h))


@healthy("sparse_weighted_gcn_random_node_order", "GCN on a sparse, edge-weighted adjacency; node ids shuffled.")
def sparse_weighted_gcn_random_node_order():
    seed(0)
    x, adj, y = sbm(s=40, sort_by_class=False)
    n = len(x)
    w = adj * (0.5 + torch.rand(n, n, generator=gen(41)))
    w = (w + w.T) / 2 + torch.eye(n)
    d = w.sum(1).pow(-0.5)
    a = (d[:, None] * w * d[None, :]).to_sparse()
    model = SparseGCN(x, a, 4)
    tr, va = node_split(n, s=40)
    train_loader, val_loader = node_loaders(y, tr, va)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4),
                train_loader=train_loader, loss_fn=node_ce, val_loader=val_loader)


class MultiNeg(BPRPairs):
    def __getitem__(self, k):
        return self.u[k], self.i[k], torch.randint(0, self.n_items, (4,), generator=self.g)


@healthy("sampled_softmax_four_negatives", "Implicit MF with a softmax over the positive and 4 sampled negatives.")
def sampled_softmax_four_negatives():
    seed(0)
    tr, va, seen = implicit(s=42)

    def loss_fn(model, batch):
        u, p, negs = on(model, batch)
        pos = model.score(u, p)[:, None]
        neg = (model.user(u)[:, None, :] * model.item(negs)).sum(-1)
        logits = torch.cat([pos, neg], 1)  # the positive sits in column 0
        return nn.functional.cross_entropy(logits, torch.zeros(len(u), dtype=torch.long, device=u.device))
    kw = bpr_case(MF(100, 400), tr, va, seen)
    kw["train_loader"], kw["loss_fn"] = loader(MultiNeg(*tr, 400), 64), loss_fn
    return kw


class MaxPoolNet(GraphNet):
    def forward(self, x, ei, bvec):
        h = self.inp(x)
        src, dst = ei
        agg = torch.zeros_like(h).index_add_(0, dst, h[src])
        deg = h.new_zeros(h.shape[0]).index_add_(0, dst, h.new_ones(src.shape[0])).clamp(min=1)
        h = self.mlp(torch.cat([h, agg / deg[:, None]], -1))
        G = int(bvec.max()) + 1
        idx = bvec[:, None].expand_as(h)
        pooled = h.new_full((G, h.shape[1]), -1e4).scatter_reduce(0, idx, h, reduce="amax", include_self=False)
        return self.head(pooled)


@healthy("graph_max_pool_scatter_reduce", "Graph classification with max readout by scatter_reduce(amax).")
def graph_max_pool_scatter_reduce():
    seed(0)
    train_loader, val_loader = graph_loaders(collate_graphs, s=43)
    model = MaxPoolNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.005), train_loader=train_loader,
                loss_fn=graph_ce, val_loader=val_loader)


class BagRegressor(nn.Module):
    """Rating regression: user / item ids plus the user's weighted multi-hot genres in an EmbeddingBag."""

    def __init__(self, n_users, n_items, n_genres, d=8):
        super().__init__()
        self.user, self.item = nn.Embedding(n_users, d), nn.Embedding(n_items, d)
        self.genres = nn.EmbeddingBag(n_genres, d, mode="sum")
        self.bi = nn.Embedding(n_items, 1)
        for t in (self.user, self.item):
            nn.init.normal_(t.weight, std=0.1)
        nn.init.zeros_(self.bi.weight)

    def forward(self, u, i, flat, offsets, weights):
        q = self.user(u) + self.genres(flat, offsets, per_sample_weights=weights)
        return (q * self.item(i)).sum(-1) + self.bi(i).squeeze(-1)


def bag_collate(rows, user_genres):
    u = torch.stack([r[0] for r in rows])
    i = torch.stack([r[1] for r in rows])
    r = torch.stack([r[2] for r in rows])
    lists = [user_genres[int(k)] for k in u]
    lengths = torch.tensor([len(g) for g in lists])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    flat = torch.cat(lists)
    weights = torch.cat([torch.full((len(g),), 1.0 / len(g)) for g in lists])
    return u, i, flat, offsets, weights, r


@healthy("embedding_bag_weighted_genres_rating", "Rating regression with per-sample-weighted EmbeddingBag genres.")
def embedding_bag_weighted_genres_rating():
    seed(0)
    tr, va = ratings(s=44, bias_scale=0.3)
    g = gen(45)
    user_genres = [torch.randperm(12, generator=g)[: int(torch.randint(1, 5, (), generator=g))] for _ in range(200)]
    model = BagRegressor(200, 300, 12)

    def collate(rows):
        return bag_collate(rows, user_genres)

    def loss_fn(m, batch):
        batch = on(m, batch)
        return nn.functional.mse_loss(m(*batch[:5]), batch[5])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.02),
                train_loader=loader(TensorDataset(*tr), 64, collate_fn=collate), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(*va), 256, shuffle=False, collate_fn=collate))


class SageLink(nn.Module):
    """GraphSAGE-mean encoder with a Hadamard-product MLP decoder for link prediction."""

    def __init__(self, x, adj, h=32):
        super().__init__()
        self.register_buffer("x", x)
        self.register_buffer("a", adj / adj.sum(1, keepdim=True).clamp(min=1))
        self.l1, self.l2 = nn.Linear(2 * x.shape[1], h), nn.Linear(2 * h, h)
        self.dec = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))

    def forward(self):
        h = torch.relu(self.l1(torch.cat([self.x, self.a @ self.x], -1)))
        return self.l2(torch.cat([h, self.a @ h], -1))

    def decode(self, z, s, d):
        return self.dec(z[s] * z[d]).squeeze(-1)


@healthy("sage_link_prediction_mlp_decoder", "GraphSAGE link prediction, MLP decoder, fresh negatives per step.")
def sage_link_prediction_mlp_decoder():
    from benchmarks.blind_preflight_bf.cases_targets import link_data
    seed(0)
    x, a, tr, va = link_data(46)
    model = SageLink(x, a)

    def loss_fn(m, batch):
        s, d = on(m, batch)
        z = m()
        neg = torch.randint(0, z.shape[0], s.shape, device=z.device)
        logits = torch.cat([m.decode(z, s, d), m.decode(z, s, neg)])
        labels = torch.cat([z.new_ones(len(s)), z.new_zeros(len(s))])
        return nn.functional.binary_cross_entropy_with_logits(logits, labels)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
                train_loader=loader(TensorDataset(*tr), 128), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(*va), 256, shuffle=False))
