"""Shapes: tensors laid out along the wrong axis in the domain's own machinery."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight.registry import token_sequences
from benchmarks.blind_preflight_bf.registry import (
    DenseGCN,
    case,
    gcn_norm,
    gen,
    loader,
    node_ce,
    node_loaders,
    node_split,
    on,
    ratings,
    sbm,
    seed,
)


class BiasMF(nn.Module):
    def __init__(self, n_users, n_items, d=8, fixed=False):
        super().__init__()
        self.user, self.item = nn.Embedding(n_users, d), nn.Embedding(n_items, d)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)
        self.bu, self.bi = nn.Embedding(n_users, 1), nn.Embedding(n_items, 1)
        nn.init.zeros_(self.bu.weight)
        nn.init.zeros_(self.bi.weight)
        self.fixed = fixed

    def score(self, u, i):
        dot = (self.user(u) * self.item(i)).sum(-1)
        return dot + (self.bu(u).squeeze(-1) if self.fixed else self.bu(u)) + self.bi(i).squeeze(-1)


def rating_mse(model, batch):
    u, i, r = on(model, batch)
    return nn.functional.mse_loss(model.score(u, i), r)


@case("rating_user_bias_broadcast", "shapes",
      "The user bias self.bu(u) keeps its (B, 1) shape and is added to the (B,) dot product, so every score is "
      "broadcast to a (B, B) matrix in which row k carries user k's bias against every other pair's rating, and "
      "the user biases cannot be learned; squeeze(-1) the bias embedding.",
      r"user.?bias|\bbu\b|bias (embedding|term|lookup)|(bias|embedding\(\w*\)).{0,60}squeeze|"
      r"(B, ?1\)|\[B, ?1\]).{0,80}bias|bias.{0,80}(B, ?1\)|\[B, ?1\]|per.user (offset|bias))")
def rating_user_bias_broadcast(fixed=False):
    seed(0)
    tr, va = ratings(s=1, bias_scale=1.5)
    model = BiasMF(200, 300, fixed=fixed)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    return dict(model=model, optimizer=opt, train_loader=loader(TensorDataset(*tr), 64), loss_fn=rating_mse,
                val_loader=loader(TensorDataset(*va), 256, shuffle=False))


@case("gcn_self_loops_ones_vector", "shapes",
      "Self loops are added as adj + torch.ones(n), a length-n vector that broadcasts over every row, so the "
      "normalised adjacency links every node to every other node and the GCN averages over the whole graph; add "
      "torch.eye(n) (a diagonal) instead.",
      r"torch\.ones\(n\)|ones\(n\)|torch\.eye|\beye\(|self.loop|complete graph|every node (is )?(linked|connected)"
      r"|all.ones|fully connected (graph|adjacency)|adjacency.{0,60}(dense|full|every pair)")
def gcn_self_loops_ones_vector(fixed=False):
    seed(0)
    x, adj, y = sbm(s=2)
    n = x.shape[0]
    a_hat = gcn_norm(adj + (torch.eye(n) if fixed else torch.ones(n)))
    model = DenseGCN(x, a_hat, 4)
    tr, va = node_split(n, s=2)
    train_loader, val_loader = node_loaders(y, tr, va)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), train_loader=train_loader,
                loss_fn=node_ce, val_loader=val_loader)


class DirectedSage(nn.Module):
    def __init__(self, x, adj_in, c, h=64):
        super().__init__()
        self.register_buffer("x", x)
        self.register_buffer("a", adj_in / adj_in.sum(1, keepdim=True).clamp(min=1))
        self.mlp = nn.Sequential(nn.Linear(2 * x.shape[1], h), nn.ReLU(), nn.Linear(h, c))

    def forward(self):
        return self.mlp(torch.cat([self.x, self.a @ self.x], -1))


@case("directed_adjacency_not_transposed", "shapes",
      "adj[src, dst] = 1 stores edges src -> dst, but the mean aggregation uses adj @ x, which gathers each node's "
      "successors (out-neighbours) instead of its predecessors; messages must flow along the edges, adj.T @ x.",
      r"adj(acency)?(\.T|\.t\(\)| transpose)|transpos|out.neighbou?r|successor|predecessor|in.neighbou?r|"
      r"edge direction|wrong direction|direction of (the )?(edges|messages)|reverse(d)? (the )?edges|"
      r"(src|source).{0,40}(dst|target|destination).{0,60}(swap|flip|revers)")
def directed_adjacency_not_transposed(fixed=False):
    seed(0)
    g = gen(3)
    n, d, c = 400, 12, 3
    x = torch.randn(n, d, generator=g)
    adj = torch.zeros(n, n)
    parents = torch.randint(0, n, (n, 3), generator=g)
    adj[parents.reshape(-1), torch.arange(n).repeat_interleave(3)] = 1.0  # adj[src, dst]: edge src -> dst
    w = torch.randn(d, c, generator=g)
    y = ((adj.T / adj.T.sum(1, keepdim=True).clamp(min=1)) @ x @ w).argmax(1)
    model = DirectedSage(x, adj.T if fixed else adj, c)
    tr, va = node_split(n, s=3)
    train_loader, val_loader = node_loaders(y, tr, va)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), train_loader=train_loader,
                loss_fn=node_ce, val_loader=val_loader)


class SessionGRU(nn.Module):
    def __init__(self, n_items, d=32, fixed=False):
        super().__init__()
        self.emb = nn.Embedding(n_items, d)
        self.gru = nn.GRU(d, d, batch_first=fixed)
        self.out = nn.Linear(d, n_items)

    def forward(self, seq):  # seq: (B, T) item ids
        h, _ = self.gru(self.emb(seq))
        return self.out(h[:, -1])


@case("session_gru_not_batch_first", "shapes",
      "The session-based recommender feeds (batch, time, dim) item embeddings to nn.GRU built without "
      "batch_first=True, so the GRU runs its recurrence across the sessions of the batch and h[:, -1] is not each "
      "session's last step; pass batch_first=True.",
      r"batch_first|seq(uence)?.first|time.major|\(T, ?B|\(seq_len, ?batch|"
      r"(batch|session)s?.{0,60}(as|treated as|mistaken for) (the )?(time|sequence)|"
      r"(time|sequence) (axis|dim(ension)?).{0,60}(batch|session)|recurren\w+ (runs )?across (the )?(batch|sessions)")
def session_gru_not_batch_first(fixed=False):
    seed(0)
    n_items = 40
    seqs = token_sequences(2000, 9, n_items, s=4, low=0)
    x, y = seqs[:, :-1], seqs[:, -1]
    model = SessionGRU(n_items, fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.005),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 64), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 256, shuffle=False))


class FieldCTR(nn.Module):
    def __init__(self, n_fields, card, d=8, fixed=False):
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(card, d) for _ in range(n_fields))
        self.mlp = nn.Sequential(nn.Linear(n_fields * d, 64), nn.ReLU(), nn.Linear(64, 1))
        self.fixed = fixed

    def forward(self, x):  # x: (B, F) category ids
        e = torch.stack([emb(x[:, f]) for f, emb in enumerate(self.embs)], 1 if self.fixed else 0)
        return self.mlp(e.reshape(x.shape[0], -1)).squeeze(-1)


@case("ctr_field_embeddings_stacked_on_batch_axis", "shapes",
      "The per-field embeddings are stacked with torch.stack(..., 0) into (F, B, d) and then reshaped to "
      "(B, F*d), which interleaves fields of different samples into each row; stack along dim 1 to get (B, F, d).",
      r"torch\.stack|stack(ed|ing)? (along|on|over) (dim|axis)|\(F, ?B, ?d\)|\(B, ?F, ?d\)|"
      r"(mix|interleav|scrambl)\w* (rows|samples|fields|examples)|(rows|samples|examples).{0,40}(mix|interleav|scrambl)|"
      r"(reshape|view).{0,80}(field|sample|row|batch axis)")
def ctr_field_embeddings_stacked_on_batch_axis(fixed=False):
    seed(0)
    g = gen(5)
    n, f, card = 3000, 4, 20
    x = torch.randint(0, card, (n, f), generator=g)
    val = torch.randn(f, card, generator=g)
    logit = val[torch.arange(f), x].sum(1) + 0.5 * val[0, x[:, 0]] * val[1, x[:, 1]]
    y = (logit > logit.median()).float()
    model = FieldCTR(f, card, fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.003),
                train_loader=loader(TensorDataset(x[:2400], y[:2400]), 64), loss_fn=nn.BCEWithLogitsLoss(),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 256, shuffle=False))
