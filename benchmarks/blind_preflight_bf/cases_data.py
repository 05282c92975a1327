"""Data: collate functions, splits and negative samplers of graphs and interactions built wrong."""

from __future__ import annotations

import torch

from benchmarks.blind_preflight_bf.cases_trained import bpr_case
from benchmarks.blind_preflight_bf.registry import (
    MF,
    BPRPairs,
    DenseGCN,
    GraphNet,
    case,
    collate_graphs,
    gcn_norm,
    graph_ce,
    graph_loaders,
    implicit,
    loader,
    node_ce,
    node_loaders,
    node_split,
    sbm,
    seed,
)


@case("graph_batch_vector_repeat", "data",
      "The collate_fn builds the batch vector with torch.arange(G).repeat(n) instead of repeat_interleave(n), so "
      "node k is assigned to graph k mod G and each pooled embedding mixes nodes of all the graphs in the batch; "
      "use repeat_interleave.",
      r"repeat_interleave|\.repeat\(|batch (vector|index|assignment)|(nodes?).{0,60}(assigned|mapped|pooled).{0,40}"
      r"(wrong|other|different) graphs?|graph (ids?|index|assignment)|mix\w* nodes")
def graph_batch_vector_repeat(fixed=False):
    seed(0)
    train_loader, val_loader = graph_loaders(lambda b: collate_graphs(b, interleave=fixed), s=30)
    model = GraphNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.005), train_loader=train_loader,
                loss_fn=graph_ce, val_loader=val_loader)


@case("graph_edge_index_not_offset", "data",
      "When the collate_fn concatenates the graphs into one batch, each graph's edge_index is not shifted by the "
      "number of nodes before it, so all edges point at the first graph's nodes and the other graphs lose their "
      "structure; add the cumulative node offset to each edge_index.",
      r"offset|shift|cumulative|cumsum|edge_index.{0,80}(first graph|wrong nodes|not (shifted|incremented|renumbered))|"
      r"(node ids?|indices).{0,60}(renumber|increment|shift)|edges?.{0,40}point (at|to|into) (the )?first")
def graph_edge_index_not_offset(fixed=False):
    seed(0)
    train_loader, val_loader = graph_loaders(lambda b: collate_graphs(b, offset=fixed), s=31)
    model = GraphNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.005), train_loader=train_loader,
                loss_fn=graph_ce, val_loader=val_loader)


@case("node_split_by_id_on_class_sorted_graph", "data",
      "The train / val node masks are the first and last half of the node ids, but the generated graph stores its "
      "nodes grouped by class, so training sees only classes 0 and 1 and validation only classes 2 and 3; split a "
      "torch.randperm of the node ids.",
      r"randperm|permut|random (split|permutation)|(sorted|ordered|grouped) by (class|label)|"
      r"(split|mask)s?.{0,80}(node ids?|contiguous|first (half|\d+)|by index)|classes? (0 and 1|missing|unseen|absent)|"
      r"(unseen|missing|absent) classes")
def node_split_by_id_on_class_sorted_graph(fixed=False):
    seed(0)
    x, adj, y = sbm(s=32)
    n = x.shape[0]
    model = DenseGCN(x, gcn_norm(adj + torch.eye(n)), 4)
    tr, va = node_split(n, s=32) if fixed else (torch.arange(n // 2), torch.arange(n // 2, n))
    train_loader, val_loader = node_loaders(y, tr, va)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), train_loader=train_loader,
                loss_fn=node_ce, val_loader=val_loader)


@case("bpr_negatives_drawn_from_user_range", "data",
      "The BPR negative sampler draws torch.randint(0, n_users) item ids, and with 100 users and 400 items three "
      "quarters of the catalogue is never used as a negative and is never pushed down; sample negatives from "
      "range(n_items).",
      r"n_users|num_users|n_items|num_items|(negative|sampler)\w*.{0,80}(range|subset|part of|fraction|never|only)|"
      r"(items?|catalog\w*).{0,60}never.{0,40}(negative|sampled|pushed)|randint")
def bpr_negatives_drawn_from_user_range(fixed=False):
    seed(0)
    tr, va, seen = implicit(s=33)
    kw = bpr_case(MF(100, 400), tr, va, seen)
    kw["train_loader"] = loader(BPRPairs(*tr, 400, neg_high=400 if fixed else 100), 64)
    return kw


@case("bpr_negative_sampler_reseeded_per_item", "data",
      "The Dataset's __getitem__ creates torch.Generator().manual_seed(0) on every call to draw the negative, so "
      "every triple gets the same negative item and the other items are never sampled as negatives; keep one "
      "generator (or the global RNG) across calls.",
      r"manual_seed|re.?seed|(same|identical|one|single|constant) negative|generator|(negative|sampler)\w*.{0,80}"
      r"(same|identical|constant|never change|repeat)")
def bpr_negative_sampler_reseeded_per_item(fixed=False):
    seed(0)
    tr, va, seen = implicit(s=34)
    kw = bpr_case(MF(100, 400), tr, va, seen)
    kw["train_loader"] = loader(BPRPairs(*tr, 400, reseed=not fixed), 64)
    return kw
