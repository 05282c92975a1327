"""Shapes: tensors laid out in a way the code does not expect, with no error raised."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_af.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed


# --------------------------------------------------------------------------------------------- point clouds
def clouds(n, s, npts=64):
    """Rods, disks and blobs of points, randomly rotated and scaled: (n, npts, 3) xyz, class 0/1/2."""
    g = gen(s)
    cls = torch.randint(0, 3, (n,), generator=g)
    axes = torch.tensor([[1.0, 0.06, 0.06], [1.0, 1.0, 0.06], [0.6, 0.6, 0.6]])
    pts = torch.randn(n, npts, 3, generator=g) * axes[cls][:, None, :]
    rot, _ = torch.linalg.qr(torch.randn(n, 3, 3, generator=g))
    pts = pts @ rot * (0.5 + torch.rand(n, 1, 1, generator=g))
    return pts, cls


class PointNetLite(nn.Module):
    def __init__(self, to_channels_first):
        super().__init__()
        self.to_channels_first = to_channels_first
        self.point_mlp = nn.Sequential(nn.Conv1d(3, 64, 1), nn.ReLU(), nn.Conv1d(64, 128, 1), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 3))

    def forward(self, pts):  # pts: (B, N, 3) as the loader gives them
        return self.head(self.point_mlp(self.to_channels_first(pts)).max(dim=2).values)


@case("af_pointcloud_reshape_not_transpose", "shapes",
      bug="The (B, N, 3) point clouds are turned into Conv1d's (B, C, N) layout with pts.reshape(B, 3, N) instead of "
          "pts.transpose(1, 2): reshape keeps the memory order, so each 'point' the 1x1 convolutions see is three "
          "numbers taken from different points and coordinates, and the xyz geometry is scrambled.",
      cause_pattern=r"(reshape|\.view)\W.{0,80}(instead of|not|rather than).{0,30}(transpose|permute)|"
                    r"(transpose|permute)\(?.{0,40}(instead of|not|rather than).{0,30}(reshape|view)|"
                    r"scrambl.{0,60}(xyz|coordinate|point)|(xyz|coordinates?) .{0,60}(mixed|scrambled|interleav)|"
                    r"reshap.{0,60}(B, ?3, ?N|channels?.first).{0,80}(memory order|interleav|mix)")
def pointcloud_reshape(fixed=False):
    seed(0)
    (x, y), (vx, vy) = clouds(900, 1), clouds(300, 2)
    to_cf = (lambda p: p.transpose(1, 2)) if fixed else (lambda p: p.reshape(p.shape[0], 3, p.shape[1]))
    model = PointNetLite(to_cf)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("af_pointcloud_reshape_not_transpose", fixed_of(pointcloud_reshape),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------- directed GNN
def trees(n_graphs, s, n=16, c=4):
    """Random rooted trees; adj[b, src, dst] = 1 for the edge parent -> child. A node's label is its parent's type."""
    g = gen(s)
    types = torch.randint(0, c, (n_graphs, n), generator=g)
    adj = torch.zeros(n_graphs, n, n)
    y = types.clone()
    for b in range(n_graphs):
        for j in range(1, n):
            p = int(torch.randint(0, j, (1,), generator=g))
            adj[b, p, j] = 1.0
            y[b, j] = types[b, p]
    x = F.one_hot(types, c).float() + 0.3 * torch.randn(n_graphs, n, c, generator=g)
    return x, adj, y


class TreeMessagePassing(nn.Module):
    def __init__(self, aggregate, d_in=4, d=64, c=4):
        super().__init__()
        self.aggregate = aggregate
        self.lin_self, self.lin_msg = nn.Linear(d_in, d), nn.Linear(d_in, d)
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, c))

    def forward(self, x, adj):
        return self.out(self.lin_self(x) + self.lin_msg(self.aggregate(adj, x)))


def node_ce(model, batch):
    x, adj, y = batch
    logits = model(x, adj)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@case("af_gnn_messages_to_source", "shapes",
      bug="The adjacency is stored as adj[src, dst] (edge parent -> child) but messages are aggregated with "
          "torch.bmm(adj, x), which sums over each node's out-neighbours (its children); the label depends on the "
          "parent, which only adj.transpose(1, 2) @ x (the in-neighbours, the edge direction) would deliver.",
      cause_pattern=r"(adj|adjacency).{0,40}transpos|transpos.{0,40}(adj|adjacency)|"
                    r"(message|aggregat|edge).{0,60}(wrong|reverse|opposite|flipped).{0,20}direction|"
                    r"direction.{0,40}(message|edge).{0,40}(reversed|flipped|wrong)|"
                    r"(out-?neighbou?rs|children|target.to.source|successors).{0,80}(instead of|rather than|not).{0,30}"
                    r"(in-?neighbou?rs|parents?|source.to.target|predecessors)|source.and.target.{0,30}swapped")
def gnn_messages(fixed=False):
    seed(0)
    x, adj, y = trees(300, 3)
    vx, vadj, vy = trees(100, 4)
    agg = (lambda a, h: torch.bmm(a.transpose(1, 2), h)) if fixed else (lambda a, h: torch.bmm(a, h))
    model = TreeMessagePassing(agg)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, adj, y), 16), val_loader=loader(TensorDataset(vx, vadj, vy), 50, shuffle=False),
                loss_fn=node_ce, max_steps=1000)


fix("af_gnn_messages_to_source", fixed_of(gnn_messages),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val node accuracy", steps=300)


# --------------------------------------------------------------------------------------------- field embeddings
def ctr_rows(n, s, fields=4, card=20):
    g = gen(s)
    effects = torch.randn(fields, card, generator=gen(99))
    cats = torch.randint(0, card, (n, fields), generator=g)
    score = effects[torch.arange(fields), cats].sum(1)
    return cats, (score > 0).long()


class FieldEmbeddingMLP(nn.Module):
    def __init__(self, join, fields=4, card=20, d=8):
        super().__init__()
        self.join = join
        self.embs = nn.ModuleList(nn.Embedding(card, d) for _ in range(fields))
        self.mlp = nn.Sequential(nn.Linear(fields * d, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, cats):
        return self.mlp(self.join([emb(cats[:, i]) for i, emb in enumerate(self.embs)], cats.shape[0]))


@case("af_field_embeddings_cat_dim0", "shapes",
      bug="The per-field embeddings (each (B, d)) are joined with torch.cat(embs, dim=0).view(B, -1) instead of "
          "torch.cat(embs, dim=1): stacking along the batch dimension and viewing back gives each row the embeddings "
          "of other samples, so a row's features no longer belong to its own label.",
      cause_pattern=r"cat\w*\(.{0,30}dim\s*=?\s*0|concat\w*.{0,40}(along|over|on) (the )?(batch|dim(ension)? 0|first)|"
                    r"(embeddings?|features?) of (other|different) (samples|rows)|"
                    r"(rows?|samples?).{0,40}(mixed|shuffled|scrambled) (across|between) (samples|rows|the batch)|"
                    r"(stack|cat|concat)\w*.{0,60}batch (dim|axis).{0,60}(view|reshape)")
def field_cat(fixed=False):
    seed(0)
    (x, y), (vx, vy) = ctr_rows(3000, 5), ctr_rows(1000, 6)
    join = (lambda es, b: torch.cat(es, dim=1)) if fixed else (lambda es, b: torch.cat(es, dim=0).view(b, -1))
    model = FieldEmbeddingMLP(join)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


fix("af_field_embeddings_cat_dim0", fixed_of(field_cat),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------- heteroscedastic NLL
def sensor_rows(n, s):
    g = gen(s)
    x = torch.randn(n, 6, generator=g)
    mu = 2 * torch.sin(x[:, 0]) + x[:, 1] * x[:, 2]
    std = 0.1 + 0.3 * torch.sigmoid(x[:, 3])
    return x, mu + std * torch.randn(n, generator=g)


@case("af_gaussian_nll_broadcast", "shapes",
      bug="A hand-written Gaussian NLL takes mu and log_var as out[:, :1] and out[:, 1:] (shape (B, 1)) and the target y "
          "as (B,): (y - mu) broadcasts to (B, B), so every prediction is scored against every target of the batch and "
          "the mean head learns the batch mean; torch gives no warning outside its own loss modules.",
      cause_pattern=r"(gaussian|nll|log.?var|varian|heterosced|\bmu\b).{0,160}(broadcast|\(B, ?B\))|"
                    r"(broadcast\w*|\(B, ?B\)).{0,160}(gaussian|nll|log.?var|varian|heterosced|\bmu\b)|"
                    r"every prediction.{0,40}(against|with) every target")
def gaussian_nll(fixed=False):
    seed(0)
    (x, y), (vx, vy) = sensor_rows(3000, 7), sensor_rows(800, 8)
    model = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))

    def gauss_nll(model, batch):
        x, y = batch
        out = model(x)
        mu, log_var = out[:, :1], out[:, 1:]
        target = y.unsqueeze(1) if fixed else y
        return 0.5 * (log_var + (target - mu) ** 2 / log_var.exp()).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 200, shuffle=False),
                loss_fn=gauss_nll, max_steps=3000)


fix("af_gaussian_nll_broadcast", fixed_of(gaussian_nll),
    rmse_of(lambda m, b: (m(b[0])[:, 0], b[1])), "val RMSE of mu", steps=300, higher=False)


# --------------------------------------------------------------------------------------------- FT-transformer
def interaction_rows(n, s, f=8):
    g = gen(s)
    x = torch.randn(n, f, generator=g)
    return x, ((x[:, 0] * x[:, 1] + 0.7 * x[:, 2]) > 0).long()


class FTTransformer(nn.Module):
    """Each numeric feature becomes a token (x_i * w_i + b_i), a [CLS] token is prepended, attention mixes the
    tokens, the [CLS] output is classified."""

    def __init__(self, batch_first, f=8, d=32, layers=2):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(f, d) * 0.5), nn.Parameter(torch.zeros(f, d))
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.1)
        self.attn = nn.ModuleList(nn.MultiheadAttention(d, 4, batch_first=batch_first) for _ in range(layers))
        self.ff = nn.ModuleList(nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, d)) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(2 * layers))
        self.head = nn.Linear(d, 2)

    def forward(self, x):  # (B, F)
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), x[..., None] * self.w + self.b], dim=1)  # (B, F+1, d)
        for i, (attn, ff) in enumerate(zip(self.attn, self.ff)):
            a, _ = attn(t, t, t, need_weights=False)
            t = self.norms[2 * i](t + a)
            t = self.norms[2 * i + 1](t + ff(t))
        return self.head(t[:, 0])


@case("af_ft_transformer_seq_first_attention", "shapes",
      bug="The tabular transformer feeds its (B, features + 1, d) tokens to nn.MultiheadAttention built without "
          "batch_first=True, so the module reads them as (seq, batch, d): attention runs across the samples of the "
          "batch instead of across a sample's feature tokens, and the [CLS] token never sees the features.",
      cause_pattern=r"batch_first|(seq(uence)?, ?batch|\(L, ?N, ?E\)|\(S, ?N, ?E\)).{0,60}(layout|order|expect)|"
                    r"attention.{0,60}across (the )?(batch|samples)|attends? (across|over) (the )?(batch|samples)|"
                    r"(batch|sequence) (and|&) (sequence|batch) (dimensions|axes) (swapped|transposed|confused)")
def ft_transformer(fixed=False):
    seed(0)
    (x, y), (vx, vy) = interaction_rows(3000, 9), interaction_rows(1000, 10)
    model = FTTransformer(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


fix("af_ft_transformer_seq_first_attention", fixed_of(ft_transformer),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)
