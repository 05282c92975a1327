"""The loss-graph walk on a torch that frees a grad_fn's Python wrapper once nothing holds it.

torch 2.11 does (199 of 200 freed wrappers' ids were reused on an H100 machine), torch 2.13
keeps them; the walk must give the same answer on both. The fake graph below hands out its
wrappers the way torch 2.11 does: one per node while alive, a new one after.
"""

from __future__ import annotations

import weakref

import torch

from optimus_preflight.training.learnable import _graph_leaves, walk_loss_graph


class _Node:
    """A C++ autograd node: what the graph links."""

    def __init__(self, name: str, children: list[_Node] | None = None, variable: torch.Tensor | None = None):
        self.name, self.children, self.variable = name, children or [], variable
        self.wrapper: weakref.ref | None = None


class AddBackward0:
    """Its Python wrapper, cached only while something holds it."""

    def __init__(self, node: _Node):
        self._node = node
        self.variable = node.variable

    @property
    def next_functions(self) -> tuple:
        return tuple((wrap(child), 0) for child in self._node.children)


def wrap(node: _Node) -> AddBackward0:
    alive = node.wrapper() if node.wrapper is not None else None
    if alive is not None:
        return alive
    fresh = AddBackward0(node)
    node.wrapper = weakref.ref(fresh)
    return fresh


class _Loss:
    def __init__(self, root: _Node):
        self.root = root

    @property
    def grad_fn(self) -> AddBackward0:
        return wrap(self.root)


def _diamond_chain(leaf: torch.Tensor, depth: int = 40) -> tuple[_Node, _Node]:
    """loss -> two long branches -> the model's output -> a leaf; returns (loss node, output node)."""
    output = _Node("output", [_Node("leaf", variable=leaf)])
    heads = []
    for branch in range(2):
        node = output
        for step in range(depth):
            node = _Node(f"b{branch}.{step}", [node])
        heads.append(node)
    return _Node("loss", heads), output


def test_walk_reaches_the_output_when_wrappers_are_freed():
    leaf = torch.zeros(2, requires_grad=True)
    root, output = _diamond_chain(leaf)
    held_output = wrap(output)  # the probe holds the output's wrapper, as its forward hook does
    graph = walk_loss_graph(_Loss(root), excluded=set())
    assert graph.complete
    assert len(graph.nodes) == 2 * 40 + 3  # every node once: loss, both branches, output, leaf
    assert id(held_output) in graph.nodes
    assert [id(t) for t in graph.outside_leaves] == [id(leaf)]


def test_graph_leaves_finds_the_leaf_when_wrappers_are_freed():
    leaf = torch.zeros(2, requires_grad=True)
    root, _ = _diamond_chain(leaf)
    found = _graph_leaves(_Loss(root), registered=set())
    assert found is not None and [id(t) for t in found] == [id(leaf)]


def test_walk_on_a_real_graph_with_two_branches():
    weight = torch.nn.Parameter(torch.randn(3, 3))
    out = torch.randn(4, 3) @ weight
    loss = torch.nn.functional.cross_entropy(out, torch.tensor([0, 1, 2, 0]), label_smoothing=0.1)
    graph = walk_loss_graph(loss, excluded={id(weight)})
    assert graph.complete and id(out.grad_fn) in graph.nodes and graph.outside_leaves == []
