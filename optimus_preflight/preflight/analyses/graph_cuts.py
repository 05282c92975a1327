"""Where the step's graph was cut on purpose-looking calls: ``.detach()``, ``.numpy()``,
``.tolist()``, ``.item()`` and ``.data`` on a tensor that carries gradients.

A forward that leaves torch for a moment, ``np.clip(h.detach().numpy(), 0, 6)`` (the
``.detach()`` added because ``.numpy()`` refused a tensor that requires grad), comes back
with a new tensor that has no graph: every layer before the round trip gets no gradient.
The cut itself is legitimate elsewhere (a target network, a stop-gradient branch), so the
watch only records each cut and which trainable parameters the cut tensor's graph reaches;
``step.gradients`` names a cut only when those parameters got no gradient at all.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from optimus_preflight.training.learnable import graph_nodes

CUTTING = {"detach": ".detach()", "numpy": ".numpy()", "tolist": ".tolist()", "item": ".item()"}
# Calls that carry a detached tensor on towards NumPy (.detach().cpu().numpy()).
_CARRIERS = ("cpu", "clone", "float", "double", "contiguous", "to", "squeeze", "flatten", "reshape", "view")
_MAX_CUTS = 8
_MAX_NODES = 4096


@dataclass
class GraphCut:
    call: str  # ".detach()", ".data", ...
    shape: tuple[int, ...]
    params: set[str] = field(default_factory=set)  # trainable parameters the cut tensor's graph reaches
    numpy: bool = False  # the cut values went on to .numpy()


# Draws whose backward hands their parameters a gradient of zeros: torch.normal(mu, std),
# bernoulli(p), poisson(rate). Nothing reaches a parameter through them.
SAMPLERS = {"normal": "torch.normal", "bernoulli": "torch.bernoulli", "poisson": "torch.poisson",
            "binomial": "torch.binomial"}
_SAMPLING_NODES = ("NormalBackward", "BernoulliBackward", "PoissonBackward", "BinomialBackward")
# A torch.distributions draw: sample() runs under torch.no_grad(), so its result has no graph.
_DISTRIBUTIONS = ("torch/distributions/", "torch\\distributions\\")


def _draws(node: Any) -> bool:
    return type(node).__name__.rstrip("0123456789") in _SAMPLING_NODES


def _reached(node: Any, names: dict[int, str]) -> set[str]:
    """The named parameters whose AccumulateGrad nodes lie behind ``node``, not past a draw."""
    return {names[id(variable)] for current in graph_nodes([node], _MAX_NODES, stop=_draws)
            if isinstance(variable := getattr(current, "variable", None), torch.Tensor) and id(variable) in names}


def _in_distribution_sample(depth: int = 12) -> bool:
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code.co_name == "sample" and any(part in frame.f_code.co_filename for part in _DISTRIBUTIONS):
            return True
        frame = frame.f_back
    return False


# A comparison returns booleans, which carry no graph: (s > 0).float() is a constant to autograd.
COMPARISONS = {"gt": ">", "__gt__": ">", "greater": ">", "lt": "<", "__lt__": "<", "less": "<", "ge": ">=",
               "__ge__": ">=", "greater_equal": ">=", "le": "<=", "__le__": "<=", "less_equal": "<=", "eq": "==",
               "__eq__": "==", "ne": "!=", "__ne__": "!=", "not_equal": "!="}


def _call_name(name: str, func: Any) -> str | None:
    if name in CUTTING:
        return CUTTING[name]
    if name in COMPARISONS:
        return f"comparison {COMPARISONS[name]}"
    if name == "__get__" and getattr(getattr(func, "__self__", None), "__name__", "") == "data":
        return ".data"
    return None


PICKS = ("argmin", "argmax")  # indices computed from a tensor: no gradient flows back through them


class GraphCutWatch:
    """Feed it every torch function call of the step (``before`` and ``after``); ``picks`` are the
    argmin/argmax calls on tensors whose graph reaches trainable parameters (a vector quantiser's
    code choice), ``task_reach`` the parameters the first criterion's output reaches."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names  # id(parameter) -> name, trainable parameters only
        self.cuts: list[GraphCut] = []
        self.picks: list[GraphCut] = []
        self.task_reach: tuple[str, set[str]] | None = None
        self.reaches: list[tuple[str, set[str]]] = []  # every criterion's, in call order (the first is task_reach)
        self.constant_targets: list[bool] = []  # beside reaches: the criterion's target one value throughout
        self._carried: list[tuple[torch.Tensor, GraphCut]] = []  # detached outputs, held for the step only

    def criterion(self, name: str, out: Any, target: Any = None) -> None:
        """Each criterion's output: which parameters its term can send gradients to (the first's
        is the task's), and whether its target is one constant (a GAN's real/fake label)."""
        if isinstance(out, torch.Tensor) and out.grad_fn is not None and len(self.reaches) < _MAX_CUTS:
            self.reaches.append((name, _reached(out.grad_fn, self.names)))
            self.constant_targets.append(isinstance(target, torch.Tensor) and target.numel() > 1
                                         and bool((target == target.reshape(-1)[0]).all()))
            if self.task_reach is None:
                self.task_reach = self.reaches[0]

    def before(self, name: str, func: Any, args: tuple) -> GraphCut | None:
        tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if tensor is None:
            return None
        if len(self.picks) < _MAX_CUTS:
            pick = self._pick(name, tensor, args)
            if pick is not None:
                if pick.params:
                    self.picks.append(pick)
                return None
        carried = next((cut for kept, cut in self._carried if kept is tensor), None)
        if carried is not None and name == "numpy":
            carried.numpy = True
        call = _call_name(name, func)
        if call is None or not tensor.requires_grad or tensor.grad_fn is None or not torch.is_grad_enabled() \
                or len(self.cuts) >= _MAX_CUTS:
            return carried if name in _CARRIERS else None
        cut = GraphCut(call, tuple(tensor.shape), _reached(tensor.grad_fn, self.names), numpy=name == "numpy")
        if cut.params:
            self.cuts.append(cut)
        return cut

    def _pick(self, name: str, tensor: torch.Tensor, args: tuple) -> GraphCut | None:
        """A choice or a draw made from a tensor with a graph, through which no gradient flows."""
        if tensor.grad_fn is None:
            return None
        if torch.is_grad_enabled():
            if name in PICKS:
                return GraphCut(name + "()", tuple(tensor.shape), _reached(tensor.grad_fn, self.names))
            if name in SAMPLERS:
                reached = set().union(*(_reached(arg.grad_fn, self.names) for arg in args
                                        if isinstance(arg, torch.Tensor) and arg.grad_fn is not None))
                return GraphCut(SAMPLERS[name] + "()", tuple(tensor.shape), reached)
            return None
        if _in_distribution_sample():
            return GraphCut("Distribution.sample()", tuple(tensor.shape), _reached(tensor.grad_fn, self.names))
        return None

    def after(self, pending: GraphCut | None, out: Any) -> None:
        if pending is not None and isinstance(out, torch.Tensor) and len(self._carried) < 4 * _MAX_CUTS:
            self._carried.append((out, pending))

    def release(self) -> None:
        self._carried = []


def task_cut_by_pick(picks: list[GraphCut], task: tuple[str, set[str]] | None, received: set[str],
                     layers: set[str]) -> tuple[str, str, list[str]] | None:
    """(criterion, pick, parameters) when layers (Linear, Conv, RNN parameters: an encoder) that
    an argmin/argmax choice was computed from, and that do get gradients, are out of reach of
    the first criterion's output: the task loss cannot train them (the choice has no gradient),
    only the other terms do. A codebook alone out of reach (an Embedding or a plain Parameter
    compared with the encoder's output) is VQ-VAE's design: its own loss term trains it."""
    if task is None:
        return None
    criterion, reached = task
    for pick in picks:
        lost = sorted(name for name in pick.params - reached if name in received)
        if any(name in layers for name in lost):
            return criterion, pick.call, lost
    return None


def task_cut_by_detach(cuts: list[GraphCut], reaches: list[tuple[str, set[str]]], received: set[str],
                       layers: set[str], constant_targets: list[bool] | None = None,
                       ) -> tuple[str, str, list[str], str] | None:
    """(criterion, ".detach()", parameters, the criterion that trains them) when layers a
    ``.detach()`` was taken from are out of reach of the first criterion (the task), and the
    terms that do train them reach nothing the task reaches: the task's branch was cut from a
    shared encoder, and only an auxiliary task shapes it. A GAN's discriminator loss on
    detached fakes stays quiet: the generator's own term runs through the discriminator the
    first term reaches, or (the discriminator frozen for it) against a constant real label. A
    probe on a detached encoder beside the main head that trains it stays quiet too: the first
    criterion reaches the encoder."""
    if len(reaches) < 2:
        return None
    criterion, reached = reaches[0]
    constant = list(constant_targets or []) + [False] * len(reaches)
    for cut in cuts:
        if cut.call != ".detach()":
            continue
        lost = sorted(name for name in cut.params - reached if name in received and name in layers)
        training = [(name, params, fixed) for (name, params), fixed in zip(reaches[1:], constant[1:], strict=False)
                    if params & set(lost)]
        if any(fixed for _, _, fixed in training):
            continue  # an adversarial term: a constant label is the generator's objective
        trainers = [(name, params) for name, params, _ in training]
        if lost and trainers and not any(params & reached for _, params in trainers):
            return criterion, cut.call, lost, trainers[0][0]
    return None


def cut_explaining(cuts: list[GraphCut], missing: list[str]) -> GraphCut | None:
    """The first cut whose graph reaches every parameter without a gradient, or the most of them."""
    wanted = set(missing)
    best = max(cuts, key=lambda cut: len(cut.params & wanted), default=None)
    return best if best is not None and best.params & wanted else None
