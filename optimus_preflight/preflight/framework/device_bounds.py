"""Index bounds checked on the host before an accelerator kernel can assert on them.

On the CPU an index out of range (an embedding id past the table, a class target past the
logits, ``x[idx]`` past the end) raises an ``IndexError`` the preflight reports like any
other step error. On CUDA the same op is a device-side assert: the kernel aborts, the CUDA
context is lost, and every later CUDA call of the process fails, the preflight's restore of
the model included. The checks run the user's real first batch (whose targets may be out of
range) and batches they build themselves (halves of a graph batch whose node index then
points past the half, a wider padding past a model's position table), so one such op would
end the whole preflight with ``device-side assert triggered`` instead of a finding.

``HostBoundsGuard`` is a ``TorchFunctionMode`` that reads the index ranges of the ops that
assert on the device (one ``aminmax`` and one synchronisation each) and raises the CPU's
error before the kernel launches. It stays silent where it cannot read the values (fake
tensors of the memory estimate, tensor subclasses, functorch transforms): it only ever
raises for an index it has seen out of range.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

Validator = Callable[[tuple, dict], None]


class _Refused(Exception):
    """Carries the error the CPU would raise for the op (its type and message), out of a validator."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _readable(tensor: Any, device_types: Sequence[str]) -> bool:
    """A plain tensor (or Parameter) whose values this process can read, on a checked device."""
    return (type(tensor) in (torch.Tensor, nn.Parameter) and tensor.device.type in device_types
            and not torch._C._functorch.is_functorch_wrapped_tensor(tensor))


def _range_of(index: torch.Tensor) -> tuple[int, int] | None:
    if index.numel() == 0 or index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
        return None
    low, high = torch.aminmax(index.detach())
    return int(low), int(high)


def _outside(index: Any, size: int, allow_negative: bool) -> int | None:
    """The first index of ``index`` found outside ``[0, size)`` (``[-size, size)`` with negatives)."""
    if type(index) not in (torch.Tensor, nn.Parameter):
        return None
    span = _range_of(index)
    if span is None:
        return None
    low, high = span
    return high if high >= size else low if low < (-size if allow_negative else 0) else None


def _bounds_error(kind: type[Exception], bad: int | None, dim: int, size: int) -> None:
    if bad is not None:
        raise _Refused(kind(f"index {bad} is out of bounds for dimension {dim} with size {size}"))


def _arg(args: tuple, kwargs: dict, position: int, name: str, default: Any = None) -> Any:
    return args[position] if len(args) > position else kwargs.get(name, default)


class HostBoundsGuard(TorchFunctionMode):
    """Raise the CPU's ``IndexError`` for an index out of range on ``device_types`` (CUDA by
    default) before the op runs; every other call passes through unchanged."""

    def __init__(self, device_types: Sequence[str] = ("cuda",)) -> None:
        super().__init__()
        self.device_types = tuple(device_types)
        self.validators: dict[Any, Validator] = {
            F.embedding: self._embedding,
            F.embedding_bag: self._embedding,
            torch.Tensor.__getitem__: self._subscript,
            torch.Tensor.__setitem__: self._subscript,
            F.nll_loss: self._class_targets,
            F.cross_entropy: self._class_targets,
            F.binary_cross_entropy: self._probabilities,
            F.one_hot: self._one_hot,
            torch.take: self._take,
            torch.Tensor.take: self._take,
        }
        for name in ("index_select", "gather", "scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy",
                     "index_fill"):
            for owner in (torch, torch.Tensor):
                if hasattr(owner, name):
                    self.validators[getattr(owner, name)] = self._along_dim
            if hasattr(torch.Tensor, name + "_"):
                self.validators[getattr(torch.Tensor, name + "_")] = self._along_dim

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        validator = self.validators.get(func)
        if validator is not None:
            try:
                validator(args, kwargs)
            except _Refused as refused:
                raise refused.error from None
            except Exception:
                pass  # values it cannot read (a transform, a trace): the op decides, as without the guard
        return func(*args, **kwargs)

    def _checked(self, tensor: Any) -> bool:
        return _readable(tensor, self.device_types)

    def _embedding(self, args: tuple, kwargs: dict) -> None:
        ids, weight = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight")
        if self._checked(weight) and _outside(ids, weight.shape[0], allow_negative=False) is not None:
            raise _Refused(IndexError("index out of range in self"))

    def _subscript(self, args: tuple, kwargs: dict) -> None:
        tensor, index = args[0], args[1]
        if not self._checked(tensor):
            return
        items = index if isinstance(index, tuple) else (index,)
        consumed = [_dims_consumed(item) for item in items]
        if any(item is Ellipsis for item in items):
            rest = tensor.dim() - sum(c for c in consumed if c is not None)
            consumed = [rest if c is None else c for c in consumed]
        dim = 0
        for item, width in zip(items, consumed):
            if isinstance(item, torch.Tensor) and item.dtype != torch.bool and dim < tensor.dim():
                _bounds_error(IndexError, _outside(item, tensor.shape[dim], True), dim, tensor.shape[dim])
            dim += width

    def _along_dim(self, args: tuple, kwargs: dict) -> None:
        tensor, dim, index = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "dim"), _arg(args, kwargs, 2, "index")
        if self._checked(tensor) and isinstance(dim, int) and tensor.dim() > 0:
            size = tensor.shape[dim]
            _bounds_error(RuntimeError, _outside(index, size, False), dim % tensor.dim(), size)

    def _take(self, args: tuple, kwargs: dict) -> None:
        tensor, index = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "index")
        bad = _outside(index, tensor.numel(), True) if self._checked(tensor) else None
        if bad is not None:
            raise _Refused(IndexError(f"out of range: tried to access index {bad} on a tensor of {tensor.numel()} "
                                      "elements."))

    def _class_targets(self, args: tuple, kwargs: dict) -> None:
        logits, target = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "target")
        if not (self._checked(logits) and isinstance(target, torch.Tensor)) or target.is_floating_point():
            return
        classes = logits.shape[1] if logits.dim() >= 2 else logits.shape[0]
        ignore = _arg(args, kwargs, 4, "ignore_index", -100)
        bad = _outside(target[target != ignore], classes, allow_negative=False)
        if bad is not None:
            raise _Refused(IndexError(f"Target {bad} is out of bounds."))

    def _probabilities(self, args: tuple, kwargs: dict) -> None:
        probabilities = _arg(args, kwargs, 0, "input")
        if self._checked(probabilities) and probabilities.numel():
            outside = ~((probabilities >= 0) & (probabilities <= 1))
            if bool(outside.any()):
                raise _Refused(RuntimeError("all elements of input should be between 0 and 1"))

    def _one_hot(self, args: tuple, kwargs: dict) -> None:
        labels, classes = _arg(args, kwargs, 0, "tensor"), _arg(args, kwargs, 1, "num_classes", -1)
        if self._checked(labels) and isinstance(classes, int) and classes > 0 \
                and _outside(labels, classes, allow_negative=False) is not None:
            raise _Refused(RuntimeError("Class values must be smaller than num_classes."))


def _dims_consumed(item: Any) -> int | None:
    """How many of the indexed tensor's dimensions one subscript item takes (None: the Ellipsis)."""
    if item is Ellipsis:
        return None
    if item is None:
        return 0
    if isinstance(item, torch.Tensor) and item.dtype == torch.bool:
        return item.dim()
    return 1


def _compiled(model: nn.Module | None) -> bool:
    return model is not None and (hasattr(model, "_orig_mod") or getattr(model, "_compiled_call_impl", None) is not None)


@contextlib.contextmanager
def host_bounds_checked(device: torch.device, model: nn.Module | None = None) -> Iterator[None]:
    """The guard around code that runs the model on ``device``: on the CPU (which raises by
    itself) and for a compiled model (whose graph the mode would break) nothing is added."""
    if device.type == "cpu" or device.type == "meta" or _compiled(model):
        yield
        return
    with HostBoundsGuard((device.type,)):
        yield
