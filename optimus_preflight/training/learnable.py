"""Learnable tensors that ``model.parameters()`` does not list.

A leaf tensor with ``requires_grad=True`` is a statement that it should learn. Kept as a
plain module attribute (``self.scale = torch.ones(1, requires_grad=True)``), or an
``nn.Parameter`` (or a layer) in a plain list or dict (not ``nn.ParameterList``,
``nn.ModuleList``, ...), it is not registered: ``model.parameters()`` (and so the optimizer built from it),
``model.to(device)``, ``state_dict()`` and DDP/FSDP all miss it. Tensors the loss holds
(a loss module with parameters, a learnable loss weight in a closure) are outside the
model by design, and only the optimizer can train them.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# Module attributes that are the module's own registries, not user data.
_REGISTRIES = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})
_CONTAINER_DEPTH = 2  # self.weights = [[...]] is as deep as user code usually nests
_CALLABLE_DEPTH = 3  # loss_fn -> helper -> global criterion
_CONTAINER_ITEMS = 1000  # a list that long is data (a cache, a file list), not layers


def _is_learnable_leaf(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad and value.is_leaf


def _tensors_in(value: Any, path: str, depth: int = _CONTAINER_DEPTH,
                contained: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Learnable leaf tensors in ``value`` and the lists, tuples and dicts it holds; and
    the trainable parameters of modules *inside* those containers (a plain list of layers
    instead of an ``nn.ModuleList`` registers none of them)."""
    if _is_learnable_leaf(value):
        yield path, value
    elif contained and isinstance(value, nn.Module):
        yield from ((f"{path}.{name}", param) for name, param in value.named_parameters() if param.requires_grad)
    elif depth > 0 and isinstance(value, (list, tuple)):
        for index, item in enumerate(value[:_CONTAINER_ITEMS]):
            yield from _tensors_in(item, f"{path}[{index}]", depth - 1, contained=True)
    elif depth > 0 and isinstance(value, dict):  # not any Mapping: a config's values may resolve or raise
        for key, item in itertools.islice(value.items(), _CONTAINER_ITEMS):
            yield from _tensors_in(item, f"{path}[{key!r}]", depth - 1, contained=True)


def unregistered_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for the learnable leaf tensors the model's modules hold outside
    their registered parameters and buffers, each once, named as ``model.<path>``."""
    registered = {id(tensor) for tensor in model.parameters()} | {id(tensor) for tensor in model.buffers()}
    found: dict[int, tuple[str, torch.Tensor]] = {}
    for module_name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if attribute in _REGISTRIES or isinstance(value, nn.Module):
                continue
            path = f"{module_name}.{attribute}" if module_name else attribute
            for name, tensor in _tensors_in(value, path):
                if id(tensor) not in registered:
                    found.setdefault(id(tensor), (name, tensor))
    return list(found.values())


def _referenced_objects(fn: Any) -> Iterator[tuple[str, Any]]:
    """What a function can reach when it runs: its closure, defaults, the globals its
    code names, a bound method's instance attributes, a partial's arguments."""
    if isinstance(fn, nn.Module):
        return
    partial_args = getattr(fn, "args", None), getattr(fn, "keywords", None)
    if callable(getattr(fn, "func", None)) and isinstance(partial_args[0], tuple):  # functools.partial
        yield "func", fn.func
        yield from ((f"args[{i}]", value) for i, value in enumerate(partial_args[0]))
        yield from ((str(key), value) for key, value in (partial_args[1] or {}).items())
        return
    owner = getattr(fn, "__self__", None)
    if owner is not None and not inspect.ismodule(owner) and hasattr(owner, "__dict__"):
        yield from ((f"self.{key}", value) for key, value in vars(owner).items())
    function = getattr(fn, "__func__", fn)
    code = getattr(function, "__code__", None)
    if code is None:
        return
    for name, cell in zip(code.co_freevars, getattr(function, "__closure__", None) or ()):
        try:
            yield name, cell.cell_contents
        except ValueError:  # an empty cell
            continue
    for index, value in enumerate(getattr(function, "__defaults__", None) or ()):
        yield f"default[{index}]", value
    scope = getattr(function, "__globals__", {})
    for name in code.co_names:
        if name in scope:
            yield name, scope[name]


def _reached_objects(compute_loss: Callable[..., Any], model: nn.Module) -> Iterator[tuple[str, Any]]:
    """``(name, object)`` for each object outside ``model`` that ``compute_loss`` can reach when
    it runs (``_referenced_objects``), once each, through the functions it calls by those
    names to a small depth; the functions themselves are walked, not yielded."""
    model_ids = {id(module) for module in model.modules()}
    seen: set[int] = set()

    def visit(fn: Any, depth: int) -> Iterator[tuple[str, Any]]:
        for name, value in _referenced_objects(fn):
            if id(value) in seen or id(value) in model_ids:
                continue
            seen.add(id(value))
            if isinstance(value, nn.Module) or not (inspect.isfunction(value) or inspect.ismethod(value)
                                                    or hasattr(value, "func")):
                yield name, value
            elif depth > 0:
                yield from visit(value, depth - 1)

    yield from visit(compute_loss, _CALLABLE_DEPTH)


def loss_modules(compute_loss: Callable[..., Any], model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` for the modules outside ``model`` that ``compute_loss`` holds or
    reaches as ``loss_tensors`` does (a teacher, a momentum encoder, a loss with weights)."""
    found: dict[int, tuple[str, nn.Module]] = {}
    if isinstance(compute_loss, nn.Module) and not any(compute_loss is module for module in model.modules()):
        found[id(compute_loss)] = ("loss_fn", compute_loss)
    for name, value in _reached_objects(compute_loss, model):
        if isinstance(value, nn.Module):
            found.setdefault(id(value), (name, value))
    return list(found.values())


def loss_tensors(compute_loss: Callable[..., Any], model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for the learnable leaf tensors that ``compute_loss`` reaches
    outside ``model``: the parameters of loss modules it holds (a loss with its own
    weights, a teacher), and tensors with ``requires_grad`` in its closure, its
    defaults, the globals it names or (a bound method) its instance's attributes;
    through the functions it calls by those names, to a small depth."""
    excluded = {id(tensor) for tensor in model.parameters()}
    found: dict[int, tuple[str, torch.Tensor]] = {}

    def add(name: str, tensor: torch.Tensor) -> None:
        if id(tensor) not in excluded:
            found.setdefault(id(tensor), (name, tensor))

    for name, value in _reached_objects(compute_loss, model):
        if isinstance(value, nn.Module):
            for param_name, param in value.named_parameters():
                if param.requires_grad:
                    add(f"{name}.{param_name}", param)
            for tensor_name, tensor in unregistered_tensors(value):
                add(f"{name}.{tensor_name}", tensor)
        elif isinstance(value, (torch.Tensor, list, tuple, dict)):
            for tensor_name, tensor in _tensors_in(value, name):
                add(tensor_name, tensor)
    return list(found.values())


_GRAPH_NODES = 256  # enough to see past a scale or a .to(device); an activation's graph meets a parameter first


def _graph_leaves(tensor: torch.Tensor, registered: set[int]) -> list[torch.Tensor] | None:
    """The leaf tensors ``tensor`` was computed from, or None once the walk meets a
    registered tensor (an activation cached by a forward) or grows past _GRAPH_NODES."""
    found: list[torch.Tensor] = []
    stack, seen, held = [tensor.grad_fn], set(), []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        held.append(node)  # see LossGraph.held: an id is only unique while its node is alive
        if len(seen) > _GRAPH_NODES:
            return None
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: the leaf it feeds
        if isinstance(variable, torch.Tensor):
            if id(variable) in registered:
                return None
            found.append(variable)
        stack.extend(next_node for next_node, _ in getattr(node, "next_functions", ()))
    return found


def orphaned_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for non-leaf tensors with ``requires_grad`` that the model's
    modules keep as attributes and that were computed from learnable leaves the model does
    not hold (``nn.Parameter(...).cuda()``, ``torch.randn(n, requires_grad=True) * 0.01``):
    gradients flow past them to a leaf nothing can update."""
    registered = {id(tensor) for tensor in model.parameters()}
    found: dict[int, tuple[str, torch.Tensor]] = {}
    for module_name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if (attribute in _REGISTRIES or not isinstance(value, torch.Tensor) or value.is_leaf
                    or not value.requires_grad):
                continue
            leaves = _graph_leaves(value, registered)
            if leaves:
                found.setdefault(id(value), (f"{module_name}.{attribute}" if module_name else attribute, value))
    return list(found.values())


LOSS_GRAPH_NODES = 500_000  # a full walk of a large model's graph is cheap next to its backward
# Differentiable in torch's sense but with a gradient of exactly 0 everywhere: whatever
# comes before them in the graph gets zeros (a binarising bottleneck without a straight-through
# estimator). Comparisons, argmax and integer casts cut the graph instead (no gradient at all).
# Zero gradient outside their bounds: a value clamped beyond its bound is a constant.
CLAMP_OPS = ("ClampBackward0", "ClampBackward1", "ClampMaxBackward0", "ClampMinBackward0", "HardtanhBackward0")
# Random draws whose gradient with respect to their parameters is zero: torch.normal(mu, std) is
# not reparameterised (mu + std * randn_like(std) is), nor torch.bernoulli(p) / torch.poisson(rate).
SAMPLING_OPS = {"NormalBackward": "torch.normal", "BernoulliBackward": "torch.bernoulli",
                "PoissonBackward": "torch.poisson"}
ZERO_GRADIENT_OPS = ("RoundBackward0", "RoundBackward1", "FloorBackward0", "CeilBackward0", "SignBackward0",
                     "TruncBackward0", "SgnBackward0")


@dataclass
class LossGraph:
    """One walk of a loss's autograd graph."""

    outside_leaves: list[torch.Tensor] = field(default_factory=list)  # learnable, not in ``excluded``
    nodes: set[int] = field(default_factory=set)  # ids of every grad_fn node reached
    # The Python objects of those nodes, alive as long as the graph: torch (2.11 at least) frees
    # a node's wrapper once nothing holds it, and the next wrapper can take its address, so
    # without this a node met later could share a visited id and its whole branch be skipped.
    held: list[Any] = field(default_factory=list, repr=False)
    zero_gradient_ops: list[str] = field(default_factory=list)  # torch.round, floor, sign, ... in the graph
    zero_factors: int = 0  # multiplications by a constant 0 (a loss weight of 0.0)
    sampling_ops: list[str] = field(default_factory=list)  # torch.normal(mu, std) and kin, drawn with a graph
    clamp_ops: list[str] = field(default_factory=list)  # torch.clamp and kin in the graph
    # (shape, dim) of each softmax / log_softmax taken over a dimension of size 1: a constant
    # (1, or 0 for log_softmax) whose gradient is 0, as in attention-pooling scores (B, T, 1)
    # normalised over their last dimension instead of T.
    singleton_softmax: list[tuple[tuple[int, ...], int]] = field(default_factory=list)
    # "sigmoid", "1 - sigmoid", "softmax": torch.log taken straight of a probability, which
    # saturates to exactly 0 (log: -inf) where log_softmax / logsigmoid stay finite.
    log_of_probability: list[str] = field(default_factory=list)
    complete: bool = True  # False past LOSS_GRAPH_NODES


def _times_constant_zero(node: Any) -> bool:
    """A multiplication whose constant (one-value, no-grad) operand is 0."""
    for attribute in ("_saved_other", "_saved_self"):
        try:
            value = getattr(node, attribute, None)
        except RuntimeError:  # a saved tensor already freed
            continue
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.requires_grad and float(value) == 0:
            return True
    return False


def _softmax_over_one(node: Any) -> tuple[tuple[int, ...], int] | None:
    """(shape, dim) of a softmax / log_softmax node whose dim has size 1."""
    if type(node).__name__ not in ("SoftmaxBackward0", "LogSoftmaxBackward0"):
        return None
    try:
        dim, result = node._saved_dim, node._saved_result
    except (AttributeError, RuntimeError):  # a saved tensor already freed
        return None
    if dim >= 2**63:  # saved as an unsigned 64-bit integer: -1 reads 2**64 - 1
        dim -= 2**64
    if not isinstance(result, torch.Tensor) or result.dim() == 0 or result.shape[dim] != 1:
        return None
    return tuple(result.shape), dim % result.dim()


# Nodes that change a tensor's shape, not its values: a probability stays one through them.
SHAPE_ONLY = ("SqueezeBackward", "UnsqueezeBackward", "ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward",
              "ExpandBackward", "SelectBackward", "SliceBackward", "TransposeBackward", "PermuteBackward", "TBackward",
              "CloneBackward", "IndexBackward", "GatherBackward")


def _input_node(node: Any) -> Any:
    """The node feeding ``node``'s first input, past shape-only nodes."""
    inner = next((n for n, _ in getattr(node, "next_functions", ()) if n is not None), None)
    while inner is not None and type(inner).__name__.rstrip("0123456789").startswith(SHAPE_ONLY):
        inner = next((n for n, _ in getattr(inner, "next_functions", ()) if n is not None), None)
    return inner


def _log_of_probability(node: Any) -> str | None:
    """What a LogBackward node takes the log of, when it is a probability straight from a
    sigmoid or softmax (no epsilon, no clamp in between)."""
    if type(node).__name__ != "LogBackward0":
        return None
    inner = _input_node(node)
    name = type(inner).__name__
    if name == "SigmoidBackward0":
        return "sigmoid"
    if name == "SoftmaxBackward0":
        return "softmax"
    if name.startswith("RsubBackward") and type(_input_node(inner)).__name__ == "SigmoidBackward0":
        return "1 - sigmoid"
    return None


def walk_loss_graph(loss: torch.Tensor, excluded: set[int]) -> LossGraph:
    """What ``loss`` was computed from: the learnable leaves not in ``excluded`` (ids: the
    model's parameters, the optimizer's), the nodes passed and the zero-gradient ops among them."""
    graph = LossGraph()
    if loss.grad_fn is None and loss.requires_grad and id(loss) not in excluded:
        graph.outside_leaves.append(loss)  # torch.tensor(value, requires_grad=True): a loss with no graph at all
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in graph.nodes:
            continue
        graph.nodes.add(id(node))
        graph.held.append(node)
        if len(graph.nodes) > LOSS_GRAPH_NODES:
            graph.complete = False
            return graph
        name = type(node).__name__
        if name in ZERO_GRADIENT_OPS and name not in graph.zero_gradient_ops:
            graph.zero_gradient_ops.append(name)
        drawn = next((call for prefix, call in SAMPLING_OPS.items() if name.startswith(prefix)), None)
        if drawn is not None and drawn not in graph.sampling_ops:
            graph.sampling_ops.append(drawn)
        if name in CLAMP_OPS and name not in graph.clamp_ops:
            graph.clamp_ops.append(name)
        if name.startswith("MulBackward") and _times_constant_zero(node):
            graph.zero_factors += 1
        if (singleton := _softmax_over_one(node)) is not None and singleton not in graph.singleton_softmax:
            graph.singleton_softmax.append(singleton)
        if (logged := _log_of_probability(node)) is not None and logged not in graph.log_of_probability:
            graph.log_of_probability.append(logged)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: the leaf it feeds
        if isinstance(variable, torch.Tensor):
            if id(variable) not in excluded and variable.requires_grad:
                graph.outside_leaves.append(variable)
            continue
        stack.extend(next_node for next_node, _ in getattr(node, "next_functions", ()))
    return graph


def loss_leaves(loss: torch.Tensor, excluded: set[int]) -> list[torch.Tensor]:
    """The learnable leaf tensors ``loss`` was computed from that are not in ``excluded``."""
    graph = walk_loss_graph(loss, excluded)
    return graph.outside_leaves if graph.complete else []


def graph_nodes(roots: Iterable[Any], limit: int, stop: Callable[[Any], bool] | None = None) -> Iterator[Any]:
    """Each autograd node behind ``roots`` (grad_fn nodes) once, at most ``limit`` of them, not
    going past a node ``stop`` holds (it is yielded, its parents are not). The caller keeps the
    graph's output alive while iterating: a node's id is only unique while the node is."""
    stack, seen = [root for root in roots if root is not None], set()
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        if stop is None or not stop(node):
            stack.extend(parent for parent, _ in getattr(node, "next_functions", ()))
