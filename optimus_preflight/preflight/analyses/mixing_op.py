"""Which operation of a forward first hands one sample's data to other samples.

Two eval-mode forwards differ only in sample 0 (``sample_mixing``'s probes). Every torch
call of both is recorded in order; the first call whose changed inputs are confined to
sample 0 (along an axis of the probe's size) and whose output changed at other samples
along every such axis is where the samples mix: a ``.view`` of an RNN's ``h_n`` (samples
on axis 1), a ``softmax(dim=0)``, an attention or recurrence run over the batch axis.
Recording stops at a divergence of the two call sequences or at a size cap.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.data_access.worker_stacks import user_frame_text
from optimus_preflight.training.batches import leaves

MAX_CALLS = 4000
MAX_BYTES = 256 * 2**20  # of recorded copies, per forward
TOLERANCE = 1e-3  # of a tensor's largest value: a real move, far above float noise
REDUCING = {"softmax", "log_softmax", "sum", "mean", "cumsum", "cumprod", "max", "min", "amax", "amin", "std",
            "var", "norm", "logsumexp", "sort", "argsort", "argmax", "argmin"}
RESHAPING = {"view", "reshape", "flatten", "unflatten", "view_as", "reshape_as"}


@dataclass
class Call:
    name: str
    dim: Any
    inputs: list[torch.Tensor | None]  # a copy of each tensor argument (None past the cap)
    outputs: list[torch.Tensor]
    frame: str | None


@dataclass
class MixingOp:
    name: str
    dim: Any
    input_shape: tuple[int, ...]
    sample_axis: int
    output_shape: tuple[int, ...]
    frame: str | None

    def describe(self) -> str:
        where = f" at {self.frame}" if self.frame else ""
        dim = f"(dim={self.dim})" if self.dim is not None else ""
        return (f"the samples first mix in `{self.name}{dim}`{where}: it takes a {self.input_shape} tensor whose "
                f"samples lie along axis {self.sample_axis} and returns {self.output_shape}, in which changing "
                "sample 0 moves other samples")

    def cause(self) -> tuple[str, str] | None:
        """(the usual reason for this kind of operation, its fix), where one is known."""
        if self.name in RESHAPING and self.sample_axis != 0:
            return (f"A .{self.name}() does not move axes: with the samples on axis {self.sample_axis} (an RNN's h_n "
                    "is (num_layers * num_directions, batch, hidden)), reshaping to (batch, -1) fills each row with "
                    "several samples' values",
                    "Move the sample axis to the front before reshaping: h_n.transpose(0, 1).reshape(batch, -1), or "
                    "torch.cat([h_n[-2], h_n[-1]], dim=1) for the last layer's two directions.")
        if self.name in REDUCING and self.dim is None and len(self.output_shape) == 0:
            return (f"{self.name}() without a dim reduces the whole batch to one number, which then broadcasts onto "
                    "every sample: a per-row dot product or norm written (u * v).sum() where (u * v).sum(dim=1) was "
                    "meant gives every sample of the batch the same score",
                    f"Give the reduction the sample's own axis: (u * v).{self.name}(dim=1) (or dim=-1) inside the "
                    "forward; reduce over the batch only in the loss.")
        if self.name in REDUCING and self.dim in (self.sample_axis, self.sample_axis - len(self.input_shape)):
            return (f"{self.name}(dim={self.dim}) runs over the samples of the batch (axis {self.sample_axis}), so "
                    "each sample's result depends on the others (softmax weights then sum to 1 over the batch, not "
                    "over a sample's own instances, tokens or classes)",
                    f"Give {self.name} the sample's own axis (dim=1 or dim=-1 of a batch-first tensor), never the "
                    "batch axis.")
        return None


def _user_frame() -> str | None:
    return user_frame_text(sys._getframe(2))


def _tensors(value: Any) -> list[torch.Tensor]:
    return [leaf for leaf in leaves(value) if isinstance(leaf, torch.Tensor)]


class CallRecorder(TorchFunctionMode):
    """Records each torch call that returns a floating tensor: its name, ``dim``, copies of
    its tensor arguments and outputs, and the innermost frame outside torch."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []
        self.bytes = 0
        self.full = False

    def _copy(self, tensor: torch.Tensor) -> torch.Tensor | None:
        size = tensor.numel() * tensor.element_size()
        if self.full or self.bytes + size > MAX_BYTES or tensor.layout != torch.strided:
            self.full = True
            return None
        self.bytes += size
        return tensor.detach().clone()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.full or len(self.calls) >= MAX_CALLS:
            return out
        outputs = [t for t in _tensors(out) if t.is_floating_point()]
        if not outputs:
            return out
        name = getattr(func, "__name__", str(func))
        dim = kwargs.get("dim", args[1] if name in REDUCING and len(args) > 1 and isinstance(args[1], int) else None)
        inputs = [self._copy(t) for t in _tensors(list(args) + list(kwargs.values()))]
        copies = [self._copy(t) for t in outputs]
        if not self.full:
            self.calls.append(Call(name, dim, inputs, [c for c in copies if c is not None], _user_frame()))
        return out


def record_calls(forward: Callable[[], Any]) -> list[Call] | None:
    recorder = CallRecorder()
    try:
        with recorder:
            forward()
    except Exception:
        return None
    return recorder.calls


def _moved_rows(a: torch.Tensor, b: torch.Tensor, axis: int) -> set[int]:
    a, b = a.float(), b.float()
    tolerance = TOLERANCE * float(a.abs().max().clamp_min(1e-12))
    rows = ((a - b).abs() > tolerance).movedim(axis, 0).reshape(a.shape[axis], -1).any(dim=1)
    return {int(i) for i in rows.nonzero().flatten().tolist()}


def _confined_axis(a: torch.Tensor, b: torch.Tensor, keep: int) -> int | None | bool:
    """False: unchanged. An axis of ``keep`` along which only row 0 moved. None: changed
    elsewhere too, or without such an axis (cannot tell)."""
    if a.shape != b.shape or torch.equal(a, b):
        return False if a.shape == b.shape else None
    for axis, length in enumerate(a.shape):
        if length == keep and _moved_rows(a, b, axis) <= {0}:
            return axis
    return None


def _spread(a: torch.Tensor, b: torch.Tensor, keep: int) -> bool:
    axes = [axis for axis, length in enumerate(a.shape) if length == keep]
    return (a.shape == b.shape and bool(axes) and not torch.equal(a, b)
            and all(_moved_rows(a, b, axis) - {0} for axis in axes))


def first_mixing(first: list[Call], second: list[Call], keep: int) -> MixingOp | None:
    """The first call whose changed inputs are confined to sample 0 and whose output moved
    other samples; None where the sequences diverge first or no call qualifies."""
    for a, b in zip(first, second):
        if a.name != b.name or len(a.inputs) != len(b.inputs) or len(a.outputs) != len(b.outputs):
            return None
        states = [_confined_axis(x, y, keep) if x is not None and y is not None else None
                  for x, y in zip(a.inputs, b.inputs)]
        changed = [(state, x) for state, x in zip(states, a.inputs) if state is not False]
        if not changed or any(state is None for state, _ in changed):
            continue
        if a.name in REDUCING and a.dim is None and a.frame and ", in forward" in a.frame and \
                any(x.dim() == 0 and not torch.equal(x, y) for x, y in zip(a.outputs, b.outputs)):
            # a full reduction inside a model's forward: the batch collapses to one number here (the
            # loss's own reductions come later, outside any forward)
            axis, tensor = changed[0]
            return MixingOp(a.name, a.dim, tuple(tensor.shape), int(axis), (), a.frame)
        axis, tensor = changed[0]
        if a.name in REDUCING and a.dim in (axis, axis - tensor.dim()) and \
                any(not torch.equal(x, y) for x, y in zip(a.outputs, b.outputs)):
            # a statistic over the samples (a centring mean kept with keepdim=True): its one row moves for all
            return MixingOp(a.name, a.dim, tuple(tensor.shape), int(axis), tuple(a.outputs[0].shape), a.frame)
        if any(_spread(x, y, keep) for x, y in zip(a.outputs, b.outputs)):
            axis, tensor = changed[0]
            output = next(x for x, y in zip(a.outputs, b.outputs) if _spread(x, y, keep))
            return MixingOp(a.name, a.dim, tuple(tensor.shape), int(axis), tuple(output.shape), a.frame)
    return None
