"""Mechanics: message passing, attention, pooling, the two-tower logits and initialisation done wrong."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_bf.cases_targets import TwoTower, two_tower_case
from benchmarks.blind_preflight_bf.cases_trained import bpr_case
from benchmarks.blind_preflight_bf.registry import (
    MF,
    GraphNet,
    case,
    collate_graphs,
    graph_ce,
    graph_loaders,
    implicit,
    node_ce,
    node_loaders,
    node_split,
    on,
    sbm,
    seed,
)


class EdgeGCN(nn.Module):
    """Mean aggregation over an edge_index (2, E) with index_add_, two layers, [self, neighbours] per layer."""

    def __init__(self, x, edge_index, c, h=32, fixed=False):
        super().__init__()
        self.register_buffer("x", x)
        self.register_buffer("ei", edge_index)
        self.l1, self.l2 = nn.Linear(2 * x.shape[1], h), nn.Linear(2 * h, c)
        self.fixed = fixed

    def aggregate(self, h):
        src, dst = self.ei
        target = dst if self.fixed else src
        agg = torch.zeros_like(h).index_add_(0, target, h[src])
        deg = h.new_zeros(h.shape[0]).index_add_(0, target, h.new_ones(len(src))).clamp(min=1)
        return agg / deg[:, None]

    def forward(self):
        h = torch.relu(self.l1(torch.cat([self.x, self.aggregate(self.x)], -1)))
        return self.l2(torch.cat([h, self.aggregate(h)], -1))


def edge_index_of(adj):
    src, dst = adj.nonzero(as_tuple=True)
    return torch.stack([src, dst])


@case("message_passing_scatter_to_source", "mechanics",
      "The messages h[src] are scattered with index_add_(0, src, ...) onto their own source nodes instead of onto "
      "dst, so every node aggregates copies of itself and never sees its neighbours; scatter the messages to the "
      "destination index.",
      r"index_add|scatter|(src|source).{0,60}(dst|destination|target)|(dst|destination).{0,60}(src|source)|"
      r"aggregat\w* (copies of )?(itself|its own)|never sees? (its )?neighbou?rs|neighbou?rs? (are )?(never|not) "
      r"(used|aggregated|seen)")
def message_passing_scatter_to_source(fixed=False):
    seed(0)
    x, adj, y = sbm(s=20)
    model = EdgeGCN(x, edge_index_of(adj), 4, fixed=fixed)
    tr, va = node_split(x.shape[0], s=20)
    train_loader, val_loader = node_loaders(y, tr, va)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), train_loader=train_loader,
                loss_fn=node_ce, val_loader=val_loader)


class DenseGAT(nn.Module):
    def __init__(self, x, adj, c, h=32, fixed=False):
        super().__init__()
        self.register_buffer("x", x)
        self.register_buffer("adj", adj + torch.eye(len(adj)))
        self.w1, self.w2 = nn.Linear(x.shape[1], h, bias=False), nn.Linear(h, c, bias=False)
        self.a1, self.a2 = nn.Linear(2 * h, 1, bias=False), nn.Linear(2 * c, 1, bias=False)
        self.fixed = fixed

    def attend(self, h, a):
        d = h.shape[1]
        e = nn.functional.leaky_relu((h @ a.weight[0, :d])[:, None] + (h @ a.weight[0, d:])[None, :], 0.2)
        e = e.masked_fill(self.adj == 0, float("-inf") if self.fixed else 0.0)
        return torch.softmax(e, dim=1) @ h

    def forward(self):
        h = nn.functional.elu(self.attend(self.w1(self.x), self.a1))
        return self.attend(self.w2(h), self.a2)


@case("gat_non_edges_masked_with_zero", "mechanics",
      "The GAT attention logits of non-edges are masked_fill'ed with 0.0 instead of -inf before the softmax, so every "
      "node attends to all nodes of the graph and the neighbourhood structure is washed out; mask non-edges with "
      "float('-inf').",
      r"masked_fill|-inf|minus infinity|non.edges?|attends? to (all|every)|(all|every) nodes?.{0,40}(attend|attention)|"
      r"attention.{0,80}(mask|non.neighbou?r|whole graph|all nodes)|mask.{0,60}(zero|0\.0)")
def gat_non_edges_masked_with_zero(fixed=False):
    seed(0)
    x, adj, y = sbm(s=21)
    model = DenseGAT(x, adj, 4, fixed=fixed)
    tr, va = node_split(x.shape[0], s=21)
    train_loader, val_loader = node_loaders(y, tr, va)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), train_loader=train_loader,
                loss_fn=node_ce, val_loader=val_loader)


@case("two_tower_logits_query_against_query", "mechanics",
      "The in-batch logits are computed as q @ q.T, the user tower's output against itself, instead of q @ k.T "
      "against the item tower, so the diagonal 'positive' is each user with itself, the loss is trivially minimised "
      "and the item tower never enters the loss; score the queries against the item embeddings.",
      r"q ?@ ?q|query.{0,40}(against|with|times) (itself|the query|queries)|(user|query) tower.{0,60}itself|"
      r"item (tower|embeddings?|side).{0,80}(never|not) (used|enter|in the loss|trained|updated)|self.similarit|"
      r"(against|with) itself")
def two_tower_logits_query_against_query(fixed=False):
    def loss_fn(model, batch):
        u, i = on(model, batch)
        q, k = model.users(u), model.items(i)
        logits = q @ k.T if fixed else q @ q.T
        return nn.functional.cross_entropy(logits, torch.arange(len(u), device=logits.device))
    return two_tower_case(TwoTower, loss_fn, s=22)


@case("graph_pool_index_add_out_of_place", "mechanics",
      "The graph readout calls pooled.index_add(0, batch, h), the out-of-place variant whose result is discarded, so "
      "the pooled graph embeddings stay all zeros and the head sees a constant input; use index_add_ (in place) or "
      "assign the result.",
      r"index_add|out.of.place|in.place|(result|return value).{0,40}(discard|thrown away|ignored|dropped)|"
      r"pool\w*.{0,80}(zeros?|constant|empty)|readout.{0,60}(zeros?|constant)")
def graph_pool_index_add_out_of_place(fixed=False):
    seed(0)
    train_loader, val_loader = graph_loaders(collate_graphs, s=23)
    model = GraphNet(pool_in_place=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.005), train_loader=train_loader,
                loss_fn=graph_ce, val_loader=val_loader)


@case("mf_factor_tables_zero_init", "mechanics",
      "Both factor tables of the BPR matrix factorisation are initialised with nn.init.zeros_, so every score is 0 "
      "and the gradient of u . v with respect to each table is the other (zero) table: the factors never move; "
      "initialise them with small random values.",
      r"zeros_|zero.init|init\w* (to|with|at) (all )?zeros?|(tables?|factors?|embeddings?|weights?).{0,60}(all )?zeros?\b|"
      r"symmetr\w*|(small )?random (init|values)|(gradient|grad)s?.{0,60}(zero|vanish).{0,40}(table|factor|embedding)")
def mf_factor_tables_zero_init(fixed=False):
    seed(0)
    tr, va, seen = implicit(s=24)
    model = MF(100, 400)
    init = (lambda w: nn.init.normal_(w, std=0.1)) if fixed else nn.init.zeros_
    init(model.user.weight)
    init(model.item.weight)
    return bpr_case(model, tr, va, seen)
