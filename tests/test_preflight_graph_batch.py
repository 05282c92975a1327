"""data.graph_batch: GRAPH_EDGES_NOT_OFFSET, a hand-written graph collate that concatenates
edge lists without each graph's node offset; quiet with the offsets. data.duplicates does
not read a graph batch's node rows (a few atom types) as identical samples."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import DuplicateSamplesCheck, FirstBatchCheck
from optimus_preflight.preflight.checks.graph_batch import GraphBatchCheck


def graphs(n: int = 128) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        size = int(torch.randint(6, 13, (1,), generator=g))
        kinds = torch.randint(0, 2, (size,), generator=g)
        src = torch.arange(1, size)
        dst = torch.stack([torch.randint(0, int(k), (1,), generator=g) for k in src]).flatten()
        edges = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
        out.append((F.one_hot(kinds, 2).float(), edges, torch.tensor(int(kinds.sum() > size // 2))))
    return out


def collate(offset: bool):
    def join(batch):
        xs, edges, owner, ys, start = [], [], [], [], 0
        for k, (x, edge_index, y) in enumerate(batch):
            xs.append(x), edges.append(edge_index + start if offset else edge_index)
            owner.append(torch.full((len(x),), k)), ys.append(y)
            start += len(x)
        return torch.cat(xs), torch.cat(edges, 1), torch.cat(owner), torch.stack(ys)
    return join


class Gin(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.mlp, self.head = nn.Linear(2, 16), nn.Linear(16, 16), nn.Linear(16, 2)

    def forward(self, x, edge_index, owner, graphs):
        h = self.inp(x)
        h = F.relu(self.mlp(h + torch.zeros_like(h).index_add_(0, edge_index[1], h[edge_index[0]])))
        return self.head(torch.zeros(graphs, h.shape[1]).index_add_(0, owner, h))


def graph_loss(model, batch):
    x, edge_index, owner, y = batch
    return F.cross_entropy(model(x, edge_index, owner, len(y)), y)


@pytest.mark.parametrize("offset", [False, True], ids=["edges_not_offset", "edges_offset"])
def test_edge_lists_concatenated_without_offsets_fire(offset):
    model = Gin()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(graphs(), batch_size=32, shuffle=True, collate_fn=collate(offset)),
                           loss_fn=graph_loss, checks=[FirstBatchCheck(), DuplicateSamplesCheck(), GraphBatchCheck()])
    issues = {issue.code: issue for _, issue in report.issues()}
    assert ("GRAPH_EDGES_NOT_OFFSET" in issues) == (not offset)
    assert "DATA_IDENTICAL" not in issues  # 2 distinct node rows are atom types, not repeated samples
    if not offset:
        assert "batch of 32 graphs" in issues["GRAPH_EDGES_NOT_OFFSET"].message
        assert "edge_index + (number of nodes" in issues["GRAPH_EDGES_NOT_OFFSET"].fix


def collate_with_owner(owner_of):
    def join(batch):
        xs, edges, ys, start = [], [], [], 0
        for x, edge_index, y in batch:
            xs.append(x), edges.append(edge_index + start), ys.append(y)
            start += len(x)
        sizes = torch.tensor([len(x) for x, _, _ in batch])
        return torch.cat(xs), torch.cat(edges, 1), owner_of(sizes), torch.stack(ys)
    return join


@pytest.mark.parametrize("owner", ["repeat", "repeat_interleave"])
def test_a_batch_vector_that_splits_the_edges_between_graphs_fires(owner):
    def owner_of(sizes):
        graphs = torch.arange(len(sizes))
        if owner == "repeat_interleave":
            return torch.repeat_interleave(graphs, sizes)
        return graphs.repeat(int(sizes.sum()) // len(sizes) + 1)[: int(sizes.sum())]  # 0, 1, ..., G - 1, 0, 1, ...

    model = Gin()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(graphs(), batch_size=32, shuffle=True, collate_fn=collate_with_owner(owner_of)),
                           loss_fn=graph_loss, checks=[FirstBatchCheck(), GraphBatchCheck()])
    issues = {issue.code: issue for _, issue in report.issues()}
    assert ("GRAPH_BATCH_VECTOR_WRONG" in issues) == (owner == "repeat")
    if owner == "repeat":
        assert "torch.arange(G).repeat(n)" in issues["GRAPH_BATCH_VECTOR_WRONG"].message
        assert "repeat_interleave" in issues["GRAPH_BATCH_VECTOR_WRONG"].fix
