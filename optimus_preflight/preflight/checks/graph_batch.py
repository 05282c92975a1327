"""Collated graph batches whose edges miss most of the nodes (``data.graph_batch``).

``GRAPH_EDGES_NOT_OFFSET``: a hand-written collate that concatenates the graphs' node
features but their ``edge_index`` tensors unchanged. Each graph numbers its nodes from 0,
so after concatenation every edge of the batch points into the first graph's nodes and
the other graphs arrive without edges: message passing sees isolated nodes, and whatever
the label depends on in the graph's structure is invisible. PyG's ``Batch`` adds each
graph's node offset (the nodes before it); a collate of one's own has to as well.

Read from the first batch: an integer ``(2, E)`` tensor (an edge list) next to a floating
``(N, F)`` tensor (node features) with more rows than any edge id, and a label tensor of
``B`` rows (several graphs). When the edge ids reach only the first quarter of the N nodes
(and at most the size of a few graphs), the ids were not offset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_EDGES = 8
MIN_GRAPHS = 4
REACHED_SHARE = 0.25  # of the node rows the edge ids reach
CROSSING = 0.5  # share of edges whose ends the batch vector puts in two graphs


SORTED = 0.98  # share of non-decreasing steps in a source column sorted as exported
RECIPROCAL = 0.5  # share of edges whose reverse is listed: an undirected graph stored both ways


def _reciprocity(edge_index: torch.Tensor) -> float:
    nodes = int(edge_index.max()) + 1
    forward = set((edge_index[0] * nodes + edge_index[1]).tolist())
    backward = (edge_index[1] * nodes + edge_index[0]).tolist()
    return sum(code in forward for code in backward) / max(len(backward), 1)


def _sorted_share(row: torch.Tensor) -> float:
    return float((row[1:] >= row[:-1]).float().mean()) if row.numel() > 1 else 0.0


def viewed_edge_list(edge_index: torch.Tensor) -> tuple[str, float, float] | None:
    """(what, share as given, share read back) when the (2, E) edge_index is an (E, 2) list
    reshaped: read back as consecutive pairs, its edges are listed both ways (an undirected
    graph) or sorted by source (an export), as given they are not (pure)."""
    if edge_index.dim() != 2 or edge_index.shape[0] != 2 or edge_index.shape[1] < 2 * MIN_EDGES:
        return None
    unviewed = edge_index.reshape(-1).view(-1, 2).t()
    given, back = _reciprocity(edge_index), _reciprocity(unviewed)
    if back >= RECIPROCAL and given < back / 4:
        return "lists its reverse for", given, back
    given, back = _sorted_share(edge_index[0]), _sorted_share(unviewed[0])
    if back >= SORTED and given < 0.75:
        return "follows a source column sorted in order for", given, back
    return None


class GraphBatchCheck(Check):
    """GRAPH_EDGES_NOT_OFFSET: a graph batch whose edge ids were not shifted per graph."""

    name = "data.graph_batch"
    stage = Stage.DATA
    codes = ("GRAPH_EDGES_NOT_OFFSET", "GRAPH_EDGES_SCRAMBLED", "GRAPH_BATCH_VECTOR_WRONG")
    requires = (FIRST_BATCH,)

    @staticmethod
    def _batch_vector(tensors: list[torch.Tensor], edge_index: torch.Tensor, rows: int, findings: Findings) -> None:
        """GRAPH_BATCH_VECTOR_WRONG: the (N,) graph assignment of the nodes puts the two ends of most
        edges in different graphs, where every edge of a batch of whole graphs stays inside one."""
        for vector in tensors:
            if vector.dim() != 1 or vector.shape[0] != rows or vector.is_floating_point() or vector.dtype == torch.bool \
                    or int(vector.min()) < 0 or int(vector.max()) + 1 < MIN_GRAPHS or int(vector.max()) >= rows // 2:
                continue
            vector = vector.cpu()
            crossing = float((vector[edge_index[0]] != vector[edge_index[1]]).float().mean())
            if crossing < CROSSING:
                continue
            graphs = int(vector.max()) + 1
            periodic = bool((vector == torch.arange(rows) % graphs).all())
            findings.warning(
                "GRAPH_BATCH_VECTOR_WRONG",
                f"the batch's node-to-graph vector ({rows} nodes, {graphs} graphs) puts the two ends of {crossing:.0%} "
                "of the edges in different graphs, where every edge of a batch of whole graphs joins two nodes of "
                "one graph: the vector does not follow the order the graphs' nodes were concatenated in"
                + (" (it counts 0, 1, ..., G - 1 over and over: torch.arange(G).repeat(n), where "
                   "repeat_interleave was meant)" if periodic else "")
                + ", so the readout pools nodes of different graphs together and each graph's embedding is a mix of "
                "the whole batch",
                "Build the vector graph by graph, in the order the nodes were concatenated: batch = "
                "torch.repeat_interleave(torch.arange(G), nodes_per_graph) (or torch.cat([torch.full((n_i,), i) "
                "for i, n_i in enumerate(sizes)])).",
            )
            return

    @staticmethod
    def _scrambled(edge_index: torch.Tensor, findings: Findings) -> bool:
        found = viewed_edge_list(edge_index)
        if found is None:
            return False
        what, given, unviewed = found
        findings.data["summary"] = f"edge_index reads as an (E, 2) list reshaped: {what} {given:.0%} vs {unviewed:.0%}"
        findings.warning(
            "GRAPH_EDGES_SCRAMBLED",
            f"the {tuple(edge_index.shape)} edge_index looks like an (E, 2) list of (source, target) rows reshaped "
            f"with .view(2, -1) or .reshape(2, -1) instead of transposed: read back as pairs of consecutive ids, "
            f"{what} {unviewed:.0%} of the edges, against {given:.0%} as given. A view keeps the memory order, so "
            "row 0 holds the first half of the flattened pairs and row 1 the second half: almost every edge joins "
            "two unrelated nodes, and message passing averages noise",
            "Transpose the edge list: edge_index = edges.t().contiguous() (or torch.from_numpy(df[['src', "
            "'dst']].values.T)), never .view(2, -1) on an (E, 2) array.",
        )
        return True

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        tensors = [leaf for leaf in leaves(ctx.artifacts.first_batch) if isinstance(leaf, torch.Tensor)]
        edges = [t for t in tensors if t.dim() == 2 and t.shape[0] == 2 and t.shape[1] >= MIN_EDGES
                 and not t.is_floating_point() and t.dtype != torch.bool and bool((t >= 0).all())]
        nodes = [t for t in tensors if t.dim() == 2 and t.is_floating_point()]
        if not edges or not nodes:
            findings.data["summary"] = "not a graph batch"
            return
        edge_index, features = edges[0], max(nodes, key=lambda t: t.shape[0])
        if self._scrambled(edge_index.cpu(), findings):
            return
        reached = int(edge_index.max()) + 1
        rows = features.shape[0]
        graphs = [t.shape[0] for t in tensors if t.dim() >= 1 and MIN_GRAPHS <= t.shape[0] < rows
                  and t is not edge_index and t.shape[0] != 2]
        findings.data.update(node_rows=rows, edge_ids_reach=reached)
        findings.data["summary"] = f"edge ids reach {reached} of {rows} node rows"
        if not graphs or reached > REACHED_SHARE * rows:
            if reached <= rows:
                self._batch_vector([t for t in tensors if t is not edge_index], edge_index.cpu(), rows, findings)
            return
        findings.warning(
            "GRAPH_EDGES_NOT_OFFSET",
            f"the first batch's edge_index {tuple(edge_index.shape)} only reaches node ids 0..{reached - 1}, while "
            f"the node features have {rows} rows (a batch of {graphs[0]} graphs): the collate concatenated the "
            "graphs' edge lists without shifting each graph's node ids by the nodes before it, so every edge points "
            "into the first graph and the others arrive with no edges; message passing then sees isolated nodes",
            "Offset each graph's edges while collating: edge_index + (number of nodes of the graphs before it), "
            "accumulated over the batch (PyG's Batch.from_data_list / DataLoader does this).",
        )


class GraphPropagationCheck(Check):
    """GRAPH_NO_SELF_LOOPS: message passing over an adjacency without self-loops and no root
    term (analyses/graph_propagation)."""

    name = "step.graph_propagation"
    stage = Stage.STEP
    codes = ("GRAPH_NO_SELF_LOOPS", "GRAPH_MESSAGES_TO_SOURCE", "GRAPH_COMPLETE")
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        probe = get_probe(ctx)
        if probe.messages_to_source is not None:
            nodes, edges = probe.messages_to_source
            findings.warning(
                "GRAPH_MESSAGES_TO_SOURCE",
                f"the model gathers messages from one end of its {edges} edges (h[src], edge_index[0]) and scatters "
                f"them back onto that same end (index_add_(0, src, ...) / scatter_add into the {nodes} nodes): every "
                "node aggregates copies of itself, degree times over, and never sees its neighbours' features, so "
                "the layer is a per-node transform and the graph adds nothing",
                "Scatter the messages to the other end of each edge: agg.index_add_(0, dst, h[src]) (messages flow "
                "src -> dst; PyG's MessagePassing aggregates at edge_index[1]), and count the degrees over dst too.",
                "model",
            )
        if probe.complete_adjacency is not None:
            nodes = probe.complete_adjacency
            findings.warning(
                "GRAPH_COMPLETE",
                f"the model propagates node features through a fixed ({nodes}, {nodes}) adjacency with no zero entry: "
                "every node is linked to every other, so each layer averages the whole graph and every node ends up "
                "with nearly the same representation. A vector added where a matrix was meant does this: self-loops "
                "written adj + torch.ones(n) (a length-n vector, broadcast over every row) for adj + torch.eye(n)",
                "Add self-loops as a diagonal: adj + torch.eye(n) (then normalise, D^-1/2 (A + I) D^-1/2), and check "
                "that the adjacency keeps its zeros: (adj == 0).float().mean() is the share of missing edges.",
                "model",
            )
        found = probe.propagation_without_self
        if found is None:
            findings.data["summary"] = "no propagation over an adjacency without self-loops"
            return
        findings.data.update(nodes=found.nodes, mean_degree=round(found.mean_degree, 2), products=found.calls)
        if found.edges is None:
            findings.data["summary"] = f"{found.calls} product(s) with a {found.nodes}-node adjacency whose diagonal is 0"
            how = (f"through a fixed ({found.nodes}, {found.nodes}) adjacency whose diagonal is all zero ({found.calls} "
                   f"product(s) A @ H in the step, {found.mean_degree:.1f} neighbours per node on average)")
        else:
            findings.data["summary"] = f"{found.calls} scatter(s) over {found.edges} edges, none a self-loop"
            how = (f"along an edge list of {found.edges} edges over {found.nodes} nodes without a single self-loop "
                   f"({found.calls} scatter(s) of h[src] into dst, index_add_/scatter_add, in the step; "
                   f"{found.mean_degree:.1f} edges per node on average)")
        findings.warning(
            "GRAPH_NO_SELF_LOOPS",
            f"the model propagates node features {how}, and never adds a node's own features back: each layer "
            "replaces a node by its "
            "neighbours only (no self-loops), so its own features reach its output only by bouncing off neighbours. "
            "Where neighbours often carry other labels the node's own evidence is lost and accuracy stays low",
            "Add self-loops before normalising, as in Kipf & Welling: A_hat = D^-1/2 (A + I) D^-1/2 with "
            "a = a + torch.eye(n), or for an edge list src, dst = torch.cat([src, nodes]), torch.cat([dst, nodes]) "
            "with nodes = torch.arange(n) before the degrees (PyG: add_self_loops, GCNConv(add_self_loops=True)); "
            "or keep a separate root "
            "term per layer (GraphSAGE: lin_r(h) + lin_l(A @ h)).",
            "model",
        )
