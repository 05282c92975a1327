"""Targets: labels of edges, nodes, pairs and graphs built wrong."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_bf.registry import (
    MF,
    BPRPairs,
    DenseGCN,
    case,
    collate_graphs,
    gcn_norm,
    gen,
    graph_ce,
    graph_loaders,
    implicit,
    loader,
    node_ce,
    node_loaders,
    node_split,
    on,
    sbm,
    seed,
)


def link_data(s=0):
    """SBM graph; 85% of the undirected edges for message passing and training, 15% held out with one random
    negative each for validation."""
    x, adj, _ = sbm(n=300, p_in=0.08, p_out=0.004, s=s)
    src, dst = adj.triu(1).nonzero(as_tuple=True)
    perm = torch.randperm(len(src), generator=gen(s + 11))
    k = int(0.85 * len(src))
    tr, va = perm[:k], perm[k:]
    a = torch.zeros_like(adj)
    a[src[tr], dst[tr]] = 1
    a = a + a.T
    neg = torch.randint(0, x.shape[0], (len(va),), generator=gen(s + 12))
    return x, a, (src[tr], dst[tr]), (src[va], dst[va], neg)


def link_acc(model, kw):
    """Share of held-out edges scored above a random negative for the same source."""
    from benchmarks.blind_preflight_bf.registry import mean_over

    def fn(m, b):
        z = m()
        s, d, n = b
        return (((z[s] * z[d]).sum(-1) > (z[s] * z[n]).sum(-1)).sum(), len(s))
    return mean_over(model, kw["val_loader"], fn)


def link_case(loss_fn, s=6):
    seed(0)
    x, a, tr, va = link_data(s)
    model = DenseGCN(x, gcn_norm(a + torch.eye(len(x))), 16)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
                train_loader=loader(TensorDataset(*tr), 128), loss_fn=loss_fn,
                val_loader=loader(TensorDataset(*va), 256, shuffle=False))


@case("link_pred_negatives_labelled_one", "targets",
      "In link prediction the sampled negative edges get torch.ones_like labels, the same as the positive edges, "
      "so binary_cross_entropy_with_logits pushes every pair's score up and never separates edges from non-edges; "
      "label the negatives with zeros.",
      r"negative.{0,60}(label|target)|(label|target).{0,60}negative|ones_like|zeros_like|"
      r"non.edges?.{0,60}(1|one|positive)|all (pairs|labels|targets).{0,40}(1|one|positive)")
def link_pred_negatives_labelled_one(fixed=False):
    def loss_fn(model, batch):
        s, d = on(model, batch)
        z = model()
        neg = torch.randint(0, z.shape[0], s.shape, device=z.device)
        pos_l, neg_l = (z[s] * z[d]).sum(-1), (z[s] * z[neg]).sum(-1)
        labels = torch.cat([torch.ones_like(pos_l), torch.zeros_like(neg_l) if fixed else torch.ones_like(neg_l)])
        return nn.functional.binary_cross_entropy_with_logits(torch.cat([pos_l, neg_l]), labels)
    return link_case(loss_fn)


@case("node_labels_not_gathered_by_mask", "targets",
      "The training TensorDataset pairs the train node indices with y[:len(train_idx)], the first labels of the "
      "graph, instead of y[train_idx], so each train node is trained towards another node's class; index the "
      "labels with the same train_idx.",
      r"y\[train_idx\]|y\[:len|(label|target)s?.{0,60}(misalign|not aligned|mismatch|wrong nodes?|other nodes?|another node|"
      r"first \w* ?nodes|slic)|misalign\w*.{0,60}(label|target)|index(ed)? (the )?(labels|targets) (with|by)")
def node_labels_not_gathered_by_mask(fixed=False):
    seed(0)
    x, adj, y = sbm(s=7)
    n = x.shape[0]
    model = DenseGCN(x, gcn_norm(adj + torch.eye(n)), 4)
    tr, va = node_split(n, s=7)
    train_loader, val_loader = node_loaders(y, tr, va)
    train_loader = loader(TensorDataset(tr, y[tr] if fixed else y[:len(tr)]), 64)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), train_loader=train_loader,
                loss_fn=node_ce, val_loader=val_loader)


@case("bpr_positive_negative_swapped", "targets",
      "The BPR loss is -logsigmoid(score(u, neg) - score(u, pos)), with the sampled negative and the observed "
      "positive item swapped, so the model learns to rank unobserved items above the user's interactions; use "
      "score(u, pos) - score(u, neg).",
      r"swap|revers|invert|opposite|(pos(itive)?|neg(ative)?).{0,40}(order|sign)|sign.{0,40}(flip|wrong)|"
      r"(neg|negative)\w* ?- ?\w*(pos|positive)|rank\w* (unobserved|negative)\w* (items )?above")
def bpr_positive_negative_swapped(fixed=False):
    seed(0)
    tr, va, seen = implicit(s=8)
    model = MF(100, 400)

    def loss_fn(m, batch):
        u, p, ng = on(m, batch)
        diff = m.score(u, p) - m.score(u, ng) if fixed else m.score(u, ng) - m.score(u, p)
        return -nn.functional.logsigmoid(diff).mean()
    val = loader(TensorDataset(*va), 256, shuffle=False)
    val.seen = seen
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.02),
                train_loader=loader(BPRPairs(*tr, 400), 64), loss_fn=loss_fn, val_loader=val)


class TwoTower(nn.Module):
    def __init__(self, user_feats, n_items, d=16, tie=False):
        super().__init__()
        self.register_buffer("uf", user_feats)
        self.user_tower = nn.Sequential(nn.Linear(user_feats.shape[1], 64), nn.ReLU(), nn.Linear(64, d))
        self.item_tower = nn.Sequential(nn.Embedding(n_items, 32), nn.Linear(32, d))
        self.n_items = n_items

    def users(self, u):
        return self.user_tower(self.uf[u])

    def items(self, i):
        return self.item_tower(i)

    def score_all(self, u):
        return self.users(u) @ self.items(torch.arange(self.n_items)).T


def two_tower_data(s=9):
    """Users described by noisy features of their true factors; implicit positives from the true affinity."""
    from benchmarks.blind_preflight_bf.registry import latent_prefs
    tr, va, seen = implicit(s=s)
    pu, _, _ = latent_prefs(100, 400, 4, s)
    g = gen(s + 3)
    feats = torch.cat([pu, pu @ torch.randn(4, 4, generator=g)], 1) + 0.1 * torch.randn(100, 8, generator=g)
    return feats, tr, va, seen


def two_tower_case(model_cls, loss_fn, s=9, lr=0.005, **kw):
    seed(0)
    feats, tr, va, seen = two_tower_data(s)
    model = model_cls(feats, 400, **kw)
    val = loader(TensorDataset(*va), 256, shuffle=False)
    val.seen = seen
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=lr),
                train_loader=loader(TensorDataset(*tr), 128), loss_fn=loss_fn, val_loader=val)


@case("two_tower_in_batch_labels_zero", "targets",
      "The in-batch-negatives softmax scores q @ k.T, whose positive for row r sits on the diagonal, but the "
      "cross_entropy targets are torch.zeros(B) (the sampled-softmax convention with the positive in column 0), so "
      "every user is trained towards the batch's first item; use torch.arange(B).",
      r"arange|diagonal|in.batch.{0,80}(label|target)|(label|target)s?.{0,80}(zeros?\b|column 0|first item)|"
      r"zeros\(|positive.{0,40}(column|position|index)")
def two_tower_in_batch_labels_zero(fixed=False):
    def loss_fn(model, batch):
        u, i = on(model, batch)
        logits = model.users(u) @ model.items(i).T
        labels = torch.arange(len(u), device=u.device) if fixed else torch.zeros(len(u), dtype=torch.long, device=u.device)
        return nn.functional.cross_entropy(logits, labels)
    return two_tower_case(TwoTower, loss_fn)


@case("graph_labels_sorted_in_collate", "targets",
      "The graph collate_fn concatenates the graphs in batch order but builds the label tensor from the graphs "
      "sorted by edge count, so the pooled graph embeddings are paired with other graphs' labels; take the labels in "
      "the same order as the graphs.",
      r"sort|(label|target)s?.{0,80}(order|misalign|mismatch|other graphs?|wrong graphs?|permut)|"
      r"(reorder|misalign|permut)\w*.{0,80}(label|target)")
def graph_labels_sorted_in_collate(fixed=False):
    seed(0)
    train_loader, val_loader = graph_loaders(lambda b: collate_graphs(b, sort_labels=not fixed), s=10)
    from benchmarks.blind_preflight_bf.registry import GraphNet
    model = GraphNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.005), train_loader=train_loader,
                loss_fn=graph_ce, val_loader=val_loader)
