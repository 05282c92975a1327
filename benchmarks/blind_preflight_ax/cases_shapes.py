"""Shapes: tensors of the wrong shape that broadcast, scramble or pair the wrong rows, without an error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ax.registry import case, clusters, loader, ltr, seed, tabular


class FlatDocScorer(nn.Module):
    """Scores the documents of a batch of query groups one by one (a pointwise MLP over the flattened docs)."""
    def __init__(self, d=8, fixed=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 1))
        self.fixed = fixed

    def forward(self, x):                                   # (Q, D, d) -> (Q, D)
        n_q, n_d = x.shape[:2]
        flat = self.net(x.reshape(n_q * n_d, -1))           # query-major: q0d0, q0d1, ...
        if self.fixed:
            return flat.view(n_q, n_d)
        return flat.view(n_d, n_q).t()                      # read as document-major: scores land on other docs


@case("shapes_scores_view_document_major", "shapes",
      "The flattened document scores are query-major (q0d0, q0d1, ...) but are folded back with .view(D, Q).t() as "
      "if they were document-major, so each (query, document) slot gets the score of another document and the "
      "ListNet loss compares grades with unrelated scores.",
      r"view\(D, ?Q\)|view\(n_d, ?n_q\)|(query|document)-major|(row|column)-major|\.t\(\)|transpos|(scores?|logits)"
      r".{0,60}(misalign|wrong (doc|slot|document)|other doc|unrelated|do not line up|scrambl)|(misalign|scrambl)"
      r".{0,60}(scores?|documents?)|fold.{0,40}(back|order)|view\(Q, ?D\)|view\(n_q, ?n_d\)")
def shapes_scores_view_document_major(fixed=False):
    seed(0)
    x, g = ltr(400, 10, s=1)

    def listnet(model, batch):
        xb, gb = batch
        return -(torch.softmax(gb, 1) * torch.log_softmax(model(xb), 1)).sum(1).mean()
    model = FlatDocScorer(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:320], g[:320]), 16),
                val_loader=loader(TensorDataset(x[320:], g[320:]), 40, shuffle=False),
                loss_fn=listnet, max_steps=300)


class StackedFieldsCTR(nn.Module):
    def __init__(self, vocab=(50, 20, 8), dim=8, d_num=4, fixed=False):
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(v, dim) for v in vocab)
        self.mlp = nn.Sequential(nn.Linear(dim * len(vocab) + d_num, 64), nn.ReLU(), nn.Linear(64, 1))
        self.fixed = fixed

    def forward(self, cats, nums):
        stacked = torch.stack([e(cats[:, i]) for i, e in enumerate(self.embs)])   # (fields, B, dim)
        if self.fixed:
            flat = stacked.permute(1, 0, 2).reshape(cats.shape[0], -1)
        else:
            flat = stacked.reshape(cats.shape[0], -1)     # mixes rows of different samples
        return self.mlp(torch.cat([flat, nums], 1)).squeeze(-1)


def ctr_loss(model, batch):
    cats, nums, y = batch
    return F.binary_cross_entropy_with_logits(model(cats, nums), y)


@case("shapes_stacked_fields_reshape", "shapes",
      "The per-field embeddings are stacked with torch.stack along dim 0 into (fields, batch, dim) and then "
      ".reshape(batch, -1) without a permute, so each row's feature vector is built from embeddings of other "
      "samples in the batch.",
      r"permute|transpose|\.t\(\)|stack.{0,60}(dim ?= ?1|dim=0|dim 0|along)|(fields?, ?batch|\(F, ?B).{0,80}"
      r"(reshape|view)|(reshape|view).{0,80}(mix|scrambl|interleav|other samples|wrong (rows|samples)|across the batch"
      r"|different samples)|batch.{0,20}(first|leading).{0,40}(dim|axis)")
def shapes_stacked_fields_reshape(fixed=False):
    seed(0)
    cats, nums, y = tabular(3000, s=2)
    model = StackedFieldsCTR(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(cats[:2400], nums[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(cats[2400:], nums[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=ctr_loss, max_steps=300)


class ListScorer(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):                       # (Q, D, d) -> (Q, D, 1)
        return self.net(x)


class QueryDocScorer(nn.Module):
    def __init__(self, d=8, fixed=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2 * d, 64), nn.ReLU(), nn.Linear(64, 1))
        self.fixed = fixed

    def forward(self, docs, query):                          # (Q, D, d), (Q, d)
        n_q, n_d = docs.shape[:2]
        if self.fixed:
            q = query.repeat_interleave(n_d, dim=0).view(n_q, n_d, -1)
        else:
            q = query.repeat(n_d, 1).view(n_q, n_d, -1)      # tiles q0..qQ, q0..qQ: docs get other queries
        return self.net(torch.cat([docs, q], -1)).squeeze(-1)


def query_doc_data(n_q, n_d=10, d=8, s=0):
    g = torch.Generator().manual_seed(s)
    docs, query = torch.randn(n_q, n_d, d, generator=g), torch.randn(n_q, d, generator=g)
    score = (docs * query[:, None, :]).sum(-1)
    grades = (score.argsort(1).argsort(1).float() * 5 / n_d).floor().clamp(max=4)
    return docs, query, grades


@case("shapes_query_features_repeat_not_interleave", "shapes",
      "The listwise ranker broadcasts each query's features to its documents with query.repeat(D, 1).view(Q, D, -1); "
      "repeat tiles the whole batch (q0, q1, ..., q0, q1, ...), so documents are paired with other queries' features "
      "(repeat_interleave or unsqueeze(1).expand was meant).",
      r"repeat_interleave|\.repeat\(|repeat tiles|unsqueeze\(1\)\.expand|\.expand\(|tile[sd]? the (whole )?b"
      r"atch|(wrong|other|different|mismatch\w*) quer(y|ies)|quer(y|ies).{0,60}(misalign|wrong doc|paired|mi"
      r"smatch|shuffl|mix)|q0, ?q1")
def shapes_query_features_repeat_not_interleave(fixed=False):
    seed(0)
    docs, query, g = query_doc_data(400, s=3)

    def listnet(model, batch):
        xb, qb, gb = batch
        return -(torch.softmax(gb, 1) * torch.log_softmax(model(xb, qb), 1)).sum(1).mean()
    model = QueryDocScorer(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(docs[:320], query[:320], g[:320]), 16),
                val_loader=loader(TensorDataset(docs[320:], query[320:], g[320:]), 40, shuffle=False),
                loss_fn=listnet, max_steps=300)


class Embedder(nn.Module):
    def __init__(self, d=16, out=8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, out))

    def forward(self, x):
        return self.net(x)


@case("shapes_interleaved_triplets_chunked", "shapes",
      "The triplet loader yields rows interleaved as anchor, positive, negative per triplet (shape (B, 3, d) "
      "flattened), but the loss splits the embeddings with .chunk(3) / view(3, B, -1) along the batch, so the "
      "'anchors', 'positives' and 'negatives' are unrelated samples.",
      r"interleav|chunk|view\(3|\(B, ?3|\(3, ?B|(anchor|positive|negative)s?.{0,80}(unrelated|wrong|mismatch|random|"
      r"not (the )?(matching|paired|same))|triplet.{0,60}(order|layout|split)|(order|layout).{0,40}triplet")
def shapes_interleaved_triplets_chunked(fixed=False):
    seed(0)
    x, y = clusters(2000, s=4)
    g = torch.Generator().manual_seed(5)
    xt, yt = x[:1600], y[:1600]
    idx_by = [torch.nonzero(yt == c).squeeze(1) for c in range(20)]
    a = torch.randint(0, 1600, (3000,), generator=g)
    p = torch.stack([idx_by[int(yt[i])][torch.randint(0, len(idx_by[int(yt[i])]), (1,), generator=g)][0] for i in a])
    n = torch.randint(0, 1600, (3000,), generator=g)
    n = torch.where(yt[n] == yt[a], (n + 7) % 1600, n)
    trip = torch.stack([xt[a], xt[p], xt[n]], 1)          # (T, 3, d)

    def triplet(model, batch):
        t = batch[0]
        e = model(t.reshape(-1, t.shape[-1]))             # rows: a0, p0, n0, a1, ...
        if fixed:
            ea, ep, en = e.view(-1, 3, e.shape[-1]).unbind(1)
        else:
            ea, ep, en = e.chunk(3)
        return F.triplet_margin_loss(ea, ep, en, margin=1.0)
    model = Embedder()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(trip, torch.zeros(len(trip))), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False),
                loss_fn=triplet, max_steps=300)


class TwoTower(nn.Module):
    def __init__(self, n_users=50, n_items=60, dim=16, fixed=False):
        super().__init__()
        self.u, self.i = nn.Embedding(n_users, dim), nn.Embedding(n_items, dim)
        self.fixed = fixed

    def forward(self, users, items):
        u, v = self.u(users), self.i(items)
        if self.fixed:
            return (u * v).sum(dim=1)
        return (u @ v.t()).sum(dim=1)                    # (B,) but summed over every item of the batch


def two_tower_data(s=6, n=6000):
    g = gen_local(s)
    uf, vf = torch.randn(50, 2, generator=g), torch.randn(60, 2, generator=g)
    users, items = torch.randint(0, 50, (n,), generator=g), torch.randint(0, 60, (n,), generator=g)
    y = ((uf[users] * vf[items]).sum(1) > 0).float()
    return users, items, y


def gen_local(s):
    return torch.Generator().manual_seed(s)


@case("shapes_two_tower_matmul_sum", "shapes",
      "The two-tower score is (u @ v.T).sum(dim=1), a (B,) vector that sums each user's affinity with every item in "
      "the batch instead of the row-wise dot product (u * v).sum(1) (the diagonal), so the score barely depends on "
      "the paired item.",
      r"diag|row-?wise|element-?wise|\(u ?\* ?v\)|u ?\* ?v|(u|user) ?@ ?(v|item)s?\.T|matmul|outer product|"
      r"\(B, ?B\)|every item in the batch|all items in the batch|paired item|batch.{0,30}(sum|summed)")
def shapes_two_tower_matmul_sum(fixed=False):
    seed(0)
    users, items, y = two_tower_data()

    def bce(model, batch):
        u, i, t = batch
        return F.binary_cross_entropy_with_logits(model(u, i), t)
    model = TwoTower(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(users[:5000], items[:5000], y[:5000]), 64),
                val_loader=loader(TensorDataset(users[5000:], items[5000:], y[5000:]), 200, shuffle=False),
                loss_fn=bce, max_steps=400)
