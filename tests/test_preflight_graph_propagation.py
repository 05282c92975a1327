"""step.graph_propagation, GRAPH_NO_SELF_LOOPS: a GCN whose normalised adjacency was built
without self-loops (dense or sparse), so each layer replaces a node by its neighbours only.
Self-loops, a GraphSAGE root term, GIN's (1 + eps) * h, a residual and a learned attention
matrix stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.graph_propagation import adjacency_without_self_loops
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.graph_batch import GraphPropagationCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from tests.preflight_support import assert_quiet

NODES, FEATURES, CLASSES = 200, 16, 3


def graph():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, CLASSES, (NODES,), generator=g)
    features = torch.randn(CLASSES, FEATURES, generator=g)[labels] * 0.5 + torch.randn(NODES, FEATURES, generator=g)
    adjacency = torch.zeros(NODES, NODES)
    ends = torch.randint(0, NODES, (2, 600), generator=g)
    adjacency[ends[0], ends[1]] = 1.0
    adjacency = ((adjacency + adjacency.t()) > 0).float()
    adjacency.fill_diagonal_(0)
    return features, adjacency, labels


def normalised(adjacency, self_loops: bool):
    if self_loops:
        adjacency = adjacency + torch.eye(NODES)
    degree = adjacency.sum(1).clamp(min=1).pow(-0.5)
    return degree[:, None] * adjacency * degree[None, :]


class WholeGraph(Dataset):
    def __init__(self, *tensors):
        self.tensors = tensors

    def __len__(self):
        return 1

    def __getitem__(self, index):
        return self.tensors


class Propagating(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.first, self.second = nn.Linear(FEATURES, 16), nn.Linear(16, CLASSES)
        self.root_first, self.root_second = nn.Linear(FEATURES, 16), nn.Linear(16, CLASSES)
        self.query = nn.Linear(FEATURES, 8)

    def layer(self, h, adjacency, linear, root):
        if self.kind == "sage":
            return linear(adjacency @ h) + root(h)
        if self.kind == "gin":
            return linear(1.1 * h + adjacency @ h)
        return adjacency @ linear(h)

    def forward(self, x, adjacency):
        if self.kind == "attention":  # a learned (N, N) matrix: not a graph's adjacency
            scores = self.query(x) @ self.query(x).t()
            adjacency = torch.softmax(scores.masked_fill(torch.eye(len(x), dtype=torch.bool), -1e9), 1)
        h = torch.relu(self.layer(x, adjacency, self.first, self.root_first))
        return self.layer(h, adjacency, self.second, self.root_second)


def run(kind: str, adjacency):
    features, _, labels = graph()

    def loss_fn(model, batch):
        x, a, y = batch
        return F.cross_entropy(model(x, a), y)

    model = Propagating(kind)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(WholeGraph(features, adjacency, labels), batch_size=None), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), GraphPropagationCheck()])
    return report.check("step.graph_propagation")


@pytest.mark.parametrize("sparse", [False, True])
def test_a_gcn_adjacency_without_self_loops_is_named(sparse):
    adjacency = normalised(graph()[1], self_loops=False)
    result = run("gcn", adjacency.to_sparse() if sparse else adjacency)
    issues = [i for i in result.issues if i.code == "GRAPH_NO_SELF_LOOPS"]
    assert len(issues) == 1 and issues[0].severity.value == "warning"
    assert f"({NODES}, {NODES}) adjacency whose diagonal is all zero" in issues[0].message
    assert "torch.eye(n)" in issues[0].fix and result.data["products"] == 2


@pytest.mark.parametrize("kind,self_loops", [("gcn", True), ("sage", False), ("gin", False), ("attention", False)])
def test_self_loops_a_root_term_or_a_learned_matrix_stay_quiet(kind, self_loops):
    assert_quiet(run(kind, normalised(graph()[1], self_loops)))


def test_only_fixed_non_negative_node_by_node_matrices_count():
    adjacency = normalised(graph()[1], self_loops=False)
    features = torch.randn(NODES, 4)
    assert adjacency_without_self_loops(adjacency, features) is not None
    assert adjacency_without_self_loops(adjacency - 0.5, features) is None  # negative entries: not an adjacency
    assert adjacency_without_self_loops(adjacency.requires_grad_(), features) is None
    assert adjacency_without_self_loops(torch.zeros(NODES, NODES), features) is None  # no edges in use
    assert adjacency_without_self_loops(adjacency.detach(), torch.randn(NODES + 1, 4)) is None


class SparseGcn(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = nn.Linear(FEATURES, 16), nn.Linear(16, CLASSES)

    def forward(self, x, adjacency):
        return torch.sparse.mm(adjacency, self.second(torch.relu(torch.sparse.mm(adjacency, self.first(x)))))


def test_the_whole_preflight_reads_a_healthy_gcn_with_a_sparse_adjacency_without_a_crash():
    features, adjacency, labels = graph()
    train_mask = torch.arange(NODES) < 150

    def loss_fn(model, batch):
        x, a, y, mask = batch
        return F.cross_entropy(model(x, a)[mask], y[mask])

    model = SparseGcn()
    sparse = normalised(adjacency, self_loops=True).to_sparse()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2, weight_decay=5e-4),
                           DataLoader(WholeGraph(features, sparse, labels, train_mask), batch_size=None),
                           val_loader=DataLoader(WholeGraph(features, sparse, labels, ~train_mask), batch_size=None),
                           loss_fn=loss_fn, max_steps=200)
    assert [check.name for check in report.checks if check.status.value == "crashed"] == []
    assert [(check.name, issue.code) for check, issue in report.issues() if issue.severity.value != "info"] == []


class EdgeListGcn(nn.Module):
    """A GCN written over the edge list: h[src] scaled by the symmetric norm, index_add_ into dst."""

    def __init__(self, self_loops: bool, root: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.self_loops, self.root = self_loops, root
        self.first, self.second = nn.Linear(FEATURES, 16), nn.Linear(16, CLASSES)

    def forward(self, x, edge_index):
        src, dst = edge_index
        n = x.shape[0]
        if self.self_loops:
            nodes = torch.arange(n)
            src, dst = torch.cat([src, nodes]), torch.cat([dst, nodes])
        degree = torch.zeros(n).index_add_(0, dst, torch.ones(dst.numel())).clamp(min=1).rsqrt()
        weight = degree[src] * degree[dst]

        def propagate(h):
            out = torch.zeros_like(h).index_add_(0, dst, h[src] * weight[:, None])
            return out + h if self.root else out

        return propagate(self.second(torch.relu(propagate(self.first(x)))))


@pytest.mark.parametrize("self_loops,root,fires", [(False, False, True), (True, False, False), (False, True, False)],
                         ids=["no_self_loops", "self_loops", "root_term"])
def test_an_edge_list_gcn_without_self_loops_is_named(self_loops, root, fires):
    features, adjacency, labels = graph()
    edge_index = adjacency.nonzero().t().contiguous()

    def loss_fn(model, batch):
        x, edges, y = batch
        return F.cross_entropy(model(x, edges), y)

    model = EdgeListGcn(self_loops, root)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(WholeGraph(features, edge_index, labels), batch_size=None), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), GraphPropagationCheck()])
    issues = [i for i in report.check("step.graph_propagation").issues if i.code == "GRAPH_NO_SELF_LOOPS"]
    assert bool(issues) == fires
    if issues:
        assert f"along an edge list of {edge_index.shape[1]} edges over {NODES} nodes" in issues[0].message
        assert "torch.cat([src, nodes])" in issues[0].fix


class EdgeConvLike(nn.Module):
    """Messages from both ends of each edge, mlp([x_i, x_j]): the receiving node's own features are in them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.message, self.head = nn.Linear(2 * FEATURES, 16), nn.Linear(16, CLASSES)

    def forward(self, x, edge_index):
        src, dst = edge_index
        messages = torch.relu(self.message(torch.cat([x[dst], x[src]], -1)))
        return self.head(torch.zeros(x.shape[0], 16).index_add_(0, dst, messages))


def test_messages_that_carry_the_receiving_nodes_features_are_quiet():
    features, adjacency, labels = graph()
    edge_index = adjacency.nonzero().t().contiguous()
    model = EdgeConvLike()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(WholeGraph(features, edge_index, labels), batch_size=None),
                           loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]),
                           checks=[FirstBatchCheck(), FirstStepCheck(), GraphPropagationCheck()])
    assert_quiet(report.check("step.graph_propagation"))


@pytest.mark.parametrize("built", ["view", "transpose", "directed_unsorted"])
def test_an_edge_list_reshaped_instead_of_transposed(built):
    from optimus_preflight.preflight.checks.graph_batch import GraphBatchCheck, viewed_edge_list

    features, adjacency, labels = graph()
    rows = adjacency.nonzero()  # (E, 2), sorted by source, both directions listed
    if built == "directed_unsorted":  # one direction, shuffled: nothing to read either way
        rows = rows[rows[:, 0] < rows[:, 1]][torch.randperm(int((rows[:, 0] < rows[:, 1]).sum()),
                                                            generator=torch.Generator().manual_seed(0))]
    rows = rows.contiguous()
    edge_index = rows.view(2, -1) if built == "view" else rows.t().contiguous()
    assert (viewed_edge_list(edge_index) is not None) == (built == "view")
    model = EdgeConvLike()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(WholeGraph(features, edge_index, labels), batch_size=None),
                           loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]),
                           checks=[FirstBatchCheck(), GraphBatchCheck()])
    issues = report.check("data.graph_batch").issues
    assert [issue.code for issue in issues] == (["GRAPH_EDGES_SCRAMBLED"] if built == "view" else [])
    if issues:
        assert "lists its reverse for 100% of the edges" in issues[0].message and ".t().contiguous()" in issues[0].fix


def test_isolated_nodes_without_self_loops_are_named_as_such_by_zero_features():
    from optimus_preflight.preflight.checks.zero_features import ZeroFeaturesCheck

    features, adjacency, labels = graph()
    adjacency[:40] = 0  # 40 new nodes: no edge yet
    adjacency[:, :40] = 0
    edge_index = adjacency.nonzero().t().contiguous()
    model = EdgeListGcn(self_loops=False)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(WholeGraph(features, edge_index, labels), batch_size=None),
                           loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]),
                           checks=[FirstBatchCheck(), FirstStepCheck(), ZeroFeaturesCheck()])
    (issue,) = report.check("step.zero_features").issues
    assert "a node with no edge" in issue.message and "self-loops" in issue.fix


@pytest.mark.parametrize("masked", [False, True])
def test_unlabelled_nodes_trained_as_class_0(masked):
    from optimus_preflight.preflight.checks.split_labels import SplitLabelsCheck

    g = torch.Generator().manual_seed(4)
    nodes = 900
    labels = torch.randint(0, CLASSES, (nodes,), generator=g)
    features = torch.randn(CLASSES, FEATURES, generator=g)[labels] + torch.randn(nodes, FEATURES, generator=g)
    edge_index = torch.randint(0, nodes, (2, 3000), generator=g)
    known = torch.zeros(nodes, dtype=torch.bool)
    known[::10] = True  # 90 labelled nodes to train on, the other 810 for validation
    filled = torch.where(known, labels, torch.zeros_like(labels))  # np.zeros labels, the known ones filled in
    val_mask = ~known
    model = EdgeListGcn(self_loops=True)
    train = WholeGraph(features, edge_index, filled, known if masked else torch.ones(nodes, dtype=torch.bool))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2), DataLoader(train, batch_size=None),
                           val_loader=DataLoader(WholeGraph(features, edge_index, labels, val_mask), batch_size=None),
                           loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1])[b[3]], b[2][b[3]]),
                           checks=[FirstBatchCheck(), SplitLabelsCheck()])
    issues = report.check("data.split_labels").issues
    assert [issue.code for issue in issues] == ([] if masked else ["VAL_LABEL_SHIFT"])
    if issues:
        assert "filled with 0" in issues[0].message and "train_mask" in issues[0].fix


class ScatteringGcn(nn.Module):
    """Mean aggregation over an edge list, scattered into dst (right) or back into src."""

    def __init__(self, into: str):
        super().__init__()
        torch.manual_seed(0)
        self.into = into
        self.first, self.root, self.second = nn.Linear(FEATURES, 16), nn.Linear(FEATURES, 16), nn.Linear(16, CLASSES)

    def forward(self, x, edge_index):
        src, dst = edge_index
        target = dst if self.into == "dst" else src
        h = self.first(x)
        summed = torch.zeros_like(h).index_add_(0, target, h[src])
        degree = torch.zeros(len(x)).index_add_(0, target, torch.ones(len(src))).clamp(min=1)
        return self.second(torch.relu(summed / degree[:, None] + self.root(x)))


@pytest.mark.parametrize("into", ["src", "dst"])
def test_messages_scattered_back_onto_their_own_source_are_named(into):
    features, adjacency, labels = graph()
    edge_index = adjacency.nonzero().t().contiguous()

    def loss_fn(model, batch):
        x, edges, y = batch
        return F.cross_entropy(model(x, edges), y)

    model = ScatteringGcn(into)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(WholeGraph(features, edge_index, labels), batch_size=None), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), GraphPropagationCheck()])
    issues = [i for i in report.check("step.graph_propagation").issues if i.code == "GRAPH_MESSAGES_TO_SOURCE"]
    assert bool(issues) == (into == "src")
    if issues:
        assert "index_add_(0, dst, h[src])" in issues[0].fix


@pytest.mark.parametrize("self_loops", ["ones_vector", "eye"])
def test_self_loops_added_as_a_vector_make_the_graph_complete(self_loops):
    adjacency = graph()[1]
    looped = adjacency + (torch.ones(NODES) if self_loops == "ones_vector" else torch.eye(NODES))
    degree = looped.sum(1).pow(-0.5)
    result = run("gcn", degree[:, None] * looped * degree[None, :])
    issues = [i for i in result.issues if i.code == "GRAPH_COMPLETE"]
    assert bool(issues) == (self_loops == "ones_vector")
    if issues:
        assert f"({NODES}, {NODES}) adjacency with no zero entry" in issues[0].message
        assert "adj + torch.eye(n)" in issues[0].fix
    else:
        assert_quiet(result)
