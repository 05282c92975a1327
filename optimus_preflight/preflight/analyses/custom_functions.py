"""A user's own ``torch.autograd.Function``: its backward measured against its forward.

A Function's backward is its author's claim about the forward's derivative, and autograd
trusts it: a missed chain-rule factor (``grad_output`` left out), a sign, a derivative
written for another activation, gradients returned in another order than the inputs,
all train the weights along a direction the loss does not go, and nothing crashes.

The probe records the first call of each user Function during the step (its inputs,
copied). ``audit_function`` re-runs it in float64 and compares, per differentiable
input and for random directions ``v`` (of the input) and ``u`` (of the output), the
backward's ``u . J v`` with central finite differences of the forward: what
``torch.autograd.gradcheck`` does with the whole Jacobian, at the cost of a few forwards.

Gradient tricks that are deliberate stay out:
- a forward that returns an input unchanged (gradient reversal, gradient scaling, a
  straight-through identity): its backward is the point of it (``gradient_reversal``
  reads the reversals);
- output elements the forward holds flat or moves by a jump (rounding, sign, a
  threshold, a clamp): a straight-through estimator's backward differs there by design,
  so only outputs that move smoothly are compared;
- a forward that gives a different answer on the same input (dropout inside): finite
  differences mean nothing there.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

# Functions of these packages are theirs, not the user's (checkpointing, FSDP, kernels).
LIBRARY_ROOTS = frozenset({
    "torch", "functorch", "torchvision", "torchaudio", "torchtext", "transformers", "peft", "accelerate", "lightning",
    "pytorch_lightning", "lightning_fabric", "timm", "apex", "xformers", "flash_attn", "bitsandbytes", "triton",
    "deepspeed", "optimus_preflight", "torch_geometric", "dgl", "einops",
})
MAX_FUNCTIONS = 8
MAX_RECORDED_ELEMENTS = 4_000_000  # inputs copied over all recorded calls
MAX_INPUTS = 4  # differentiable inputs audited per Function
DRAWS = 3
STEP = 1e-3  # the perturbation, relative to the input's RMS
SMOOTH_RTOL = 0.02  # finite differences at STEP and STEP/2 agree this closely where the forward is smooth
AGREE_RTOL = 0.05
MIN_SMOOTH_ELEMENTS = 4


@dataclass
class FunctionCall:
    cls: type
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    differentiable: tuple[int, ...]  # positions of the floating tensors that required grad


@dataclass
class BackwardMismatch:
    function: str  # the class's name
    where: str  # file:line of its definition
    position: int  # which input of forward (0-based)
    shape: tuple[int, ...]
    kind: str  # "direction": not proportional to the derivative; "sign"; "scale"
    ratio: float | None  # backward / finite differences, where proportional
    relative_error: float


def is_users(cls: type) -> bool:
    root = (cls.__module__ or "").partition(".")[0]
    if root in LIBRARY_ROOTS:
        return False
    try:
        path = inspect.getfile(cls)
    except (TypeError, OSError):
        return True  # defined in a notebook or at a prompt
    return "site-packages" not in path and "dist-packages" not in path


def definition_site(cls: type) -> str:
    try:
        path = inspect.getsourcefile(cls) or inspect.getfile(cls)
        line = inspect.getsourcelines(cls)[1]
    except (TypeError, OSError):
        return cls.__qualname__
    return f"{path}:{line}"


@contextmanager
def recorded_functions(calls: list[FunctionCall]) -> Iterator[None]:
    """``torch.autograd.Function.apply`` recording the first call, with a graph, of each
    user Function; the user's ``MyFn.apply(x)`` looks ``apply`` up on the base class."""
    base = torch.autograd.Function
    real = base.__dict__["apply"]
    budget = [MAX_RECORDED_ELEMENTS]
    seen: set[type] = set()

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        if cls not in seen and len(seen) < MAX_FUNCTIONS and torch.is_grad_enabled():
            seen.add(cls)
            _record(cls, args, kwargs, calls, budget)
        return real.__func__(cls, *args, **kwargs)

    base.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        base.apply = real  # type: ignore[method-assign]


def _record(cls: type, args: tuple, kwargs: dict, calls: list[FunctionCall], budget: list[int]) -> None:
    if not is_users(cls):
        return
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    differentiable = tuple(i for i, a in enumerate(args)
                           if isinstance(a, torch.Tensor) and a.requires_grad and a.is_floating_point())
    size = sum(t.numel() for t in tensors)
    if not differentiable or size > budget[0] or any(t.is_sparse or t.is_complex() for t in tensors):
        return
    budget[0] -= size
    copied = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
    calls.append(FunctionCall(cls, copied, dict(kwargs), differentiable))


def _float_outputs(out: Any) -> list[torch.Tensor]:
    items = out if isinstance(out, (tuple, list)) else (out,)
    return [o for o in items if isinstance(o, torch.Tensor) and o.is_floating_point()]


def _rms(t: torch.Tensor) -> float:
    return float(t.pow(2).mean().sqrt()) if t.numel() else 0.0


def none_gradients(call: FunctionCall) -> list[int]:
    """Positions of differentiable inputs for which the Function's backward returns None: run
    once on the recorded inputs with a gradient of ones (a backward without a ``return``
    statement returns None for every input)."""
    try:
        inputs = [a.detach().clone().requires_grad_(i in call.differentiable) if isinstance(a, torch.Tensor) else a
                  for i, a in enumerate(call.args)]
        with torch.enable_grad():
            outputs = [o for o in _float_outputs(call.cls.apply(*inputs, **call.kwargs)) if o.requires_grad]
            if not outputs:
                return []
            grads = torch.autograd.grad(outputs, [inputs[i] for i in call.differentiable],
                                        [torch.ones_like(o) for o in outputs], allow_unused=True)
    except Exception:  # a Function tied to its device or kernels: judge nothing
        return []
    return [position for position, grad in zip(call.differentiable, grads, strict=True) if grad is None]


def audit_function(call: FunctionCall, seed: int = 0) -> BackwardMismatch | None:
    """The first differentiable input whose backward disagrees with the forward, or None
    (agreement, a deliberate trick, or a Function that cannot be re-run in float64)."""
    try:
        return _audit(call, seed)
    except Exception:  # a Function tied to float32 kernels, extensions, a device without float64
        return None


def _audit(call: FunctionCall, seed: int) -> BackwardMismatch | None:
    inputs = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in call.args]

    def forward(values: list[Any]) -> list[torch.Tensor]:
        with torch.no_grad():
            return [o.detach() for o in _float_outputs(call.cls.apply(*values, **call.kwargs))]

    first, again = forward(inputs), forward(inputs)
    if not first or any(not torch.equal(a, b) for a, b in zip(first, again, strict=True)):
        return None  # no float output, or random inside
    if any(out.shape == inputs[i].shape and torch.equal(out, inputs[i]) for out in first for i in call.differentiable):
        return None  # an identity forward: the backward is the Function's whole purpose
    generator = torch.Generator(device="cpu").manual_seed(seed)
    for position in call.differentiable[:MAX_INPUTS]:
        verdict = _audit_input(call, inputs, position, forward, generator)
        if verdict is not None:
            return verdict
    return None


def _randn(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(like.shape, generator=generator, dtype=torch.float64).to(like.device)


def _audit_input(call: FunctionCall, inputs: list[Any], position: int, forward: Any,
                 generator: torch.Generator) -> BackwardMismatch | None:
    x = inputs[position]
    scale = _rms(x) or 1.0
    ratios: list[float] = []
    errors: list[float] = []
    for _ in range(DRAWS):
        direction = _randn(x, generator) * scale

        def moved(step: float, direction: torch.Tensor = direction) -> list[torch.Tensor]:
            plus, minus = list(inputs), list(inputs)
            plus[position], minus[position] = x + step * direction, x - step * direction
            return [(a - b) / (2 * step) for a, b in zip(forward(plus), forward(minus), strict=True)]

        wide, narrow = moved(STEP), moved(STEP / 2)
        size = max((_rms(w) for w in wide), default=0.0)
        if size == 0.0:
            return None  # flat along this input: nothing to compare
        # Where the forward moves smoothly: both steps agree and the output moved at all.
        smooth = [(w - n).abs() <= SMOOTH_RTOL * w.abs() + 1e-6 * size for w, n in zip(wide, narrow, strict=True)]
        smooth = [s & (w.abs() > 1e-6 * size) for s, w in zip(smooth, wide, strict=True)]
        if sum(int(s.sum()) for s in smooth) < MIN_SMOOTH_ELEMENTS:
            return None  # a straight-through estimator's forward: flat or jumping almost everywhere
        weights = [_randn(w, generator) * s for w, s in zip(wide, smooth, strict=True)]
        expected = sum(float((u * w).sum()) for u, w in zip(weights, wide, strict=True))
        attached = [a.detach().requires_grad_(True) if i in call.differentiable else a for i, a in enumerate(inputs)]
        with torch.enable_grad():
            outputs = _float_outputs(call.cls.apply(*attached, **call.kwargs))
            pairs = [(o, u) for o, u in zip(outputs, weights, strict=True) if o.requires_grad]
            if not pairs:
                return None
            (gradient,) = torch.autograd.grad([o for o, _ in pairs], [attached[position]], [u for _, u in pairs],
                                              allow_unused=True)
        claimed = float((gradient * direction).sum()) if gradient is not None else 0.0
        if abs(expected) < 1e-9 * max(abs(claimed), 1.0):
            continue  # this draw's u and v happen to be nearly orthogonal through J
        errors.append(abs(claimed - expected) / max(abs(expected), abs(claimed)))
        ratios.append(claimed / expected)
    if not errors or max(errors) <= AGREE_RTOL:
        return None
    kind, ratio = _classify(ratios)
    return BackwardMismatch(function=call.cls.__name__, where=definition_site(call.cls), position=position,
                            shape=tuple(x.shape), kind=kind, ratio=ratio, relative_error=max(errors))


def _classify(ratios: list[float]) -> tuple[str, float | None]:
    """Proportional (every draw gave the same ratio): the backward is the derivative times
    a constant; otherwise its direction is wrong."""
    low, high = min(ratios), max(ratios)
    proportional = len(ratios) >= 2 and (low > 0 or high < 0) and high - low <= AGREE_RTOL * max(abs(low), abs(high))
    if not proportional:
        return "direction", None
    ratio = sum(ratios) / len(ratios)
    if ratio < 0:
        return "sign", ratio
    return "scale", ratio


def describe_ratio(ratio: float) -> str:
    return f"{ratio:.3g}" if math.isfinite(ratio) else str(ratio)
