"""A recipe's contracts (docs/ARCHITECTURE.md, "A recipe's contract") checked where the
toolkit calls the recipe: a builder or ``compute_loss`` that returns the wrong kind of
thing is the user's to fix, so it is one line naming the method, what it returned and
what is expected (exit 2), not a traceback deep in the loop or a misleading
``too many values to unpack``.

Each check returns what it checked, so a call site stays one line. No check reads a
tensor's value: that would cost a host sync per step.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

import torch

from optimus_preflight.errors import UserError

LOSS_EXPECTED = "a scalar loss tensor, or (loss, count) with count the number of targets the loss averages (> 0)"
LOSS_FIX = "Return the mean loss tensor itself (not loss.item(), a float or a per-sample vector), or (loss, count)."


class ContractError(UserError):
    """A recipe method returned something its contract does not allow."""


def describe(value: Any) -> str:
    """What a value is, in the words of the message: its type, and the shape of a
    tensor or the item types of a tuple."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        items = ", ".join(type(item).__name__ for item in value[:4]) + (", ..." if len(value) > 4 else "")
        return f"a {len(value)}-{type(value).__name__} ({items})"
    if isinstance(value, (str, bytes)):
        return f"{type(value).__name__} {value[:40]!r}"
    if isinstance(value, (int, float, bool)):
        return f"{type(value).__name__} {value!r}"
    return type(value).__name__


def contract_error(method: str, value: Any, expected: str, fix: str = "") -> ContractError:
    return ContractError(f"{method} returned {describe(value)}; expected {expected}",
                         fix=fix or f"Return {expected} from {method}.")


def check_loss_output(value: Any, method: str = "compute_loss") -> tuple[torch.Tensor, Any]:
    """``compute_loss``'s result as ``(loss, count or None)``: a tensor of one element,
    alone or with a count (an int > 0, or a tensor of one element)."""
    loss, count = value, None
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise contract_error(method, value, LOSS_EXPECTED, LOSS_FIX)
        loss, count = value
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise contract_error(method, value, LOSS_EXPECTED, LOSS_FIX)
    if isinstance(count, torch.Tensor):
        if count.numel() != 1:
            raise contract_error(method, value, LOSS_EXPECTED, LOSS_FIX)
    elif count is not None and (isinstance(count, bool) or not isinstance(count, numbers.Integral) or count <= 0):
        raise ContractError(f"{method} returned the count {describe(count)}; expected {LOSS_EXPECTED}",
                            fix=f"Return (loss, count) with count > 0 from {method}, or the loss alone "
                            "(then the batch size weighs it).")
    return loss, count


def check_built(value: Any, expected: type | tuple[type, ...], method: str, *, optional: bool = False) -> Any:
    """A builder's result is an instance of ``expected`` (or None where ``optional``)."""
    if value is None and optional:
        return value
    if not isinstance(value, expected):
        kinds = expected if isinstance(expected, tuple) else (expected,)
        text = " or ".join(f"a {kind.__module__}.{kind.__qualname__}" for kind in kinds)
        raise contract_error(method, value, text + (" or None" if optional else ""))
    return value


def _is_loader(value: Any) -> bool:
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict, torch.Tensor))


def check_loaders(value: Any, method: str = "build_dataloaders") -> tuple[Any, Any]:
    """``build_dataloaders``: ``(train, val or None)``, each an iterable of batches."""
    expected = "(train loader, validation loader or None), each an iterable of batches such as a DataLoader"
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise contract_error(method, value, expected)
    train, val = value
    if not _is_loader(train) or not (val is None or _is_loader(val)):
        raise contract_error(method, value, expected)
    return train, val


def check_test_loader(value: Any, method: str = "build_test_dataloader") -> Any:
    if value is not None and not _is_loader(value):
        raise contract_error(method, value, "an iterable of batches such as a DataLoader, or None")
    return value


SCHEDULER_METHODS = ("step", "state_dict", "load_state_dict")


def check_scheduler(value: Any, method: str = "build_scheduler") -> Any:
    """None, or what the loop and the checkpoints use of an LR scheduler (any torch
    LRScheduler has it; a scheduler of another library may too)."""
    if value is not None and not all(callable(getattr(value, name, None)) for name in SCHEDULER_METHODS):
        raise contract_error(method, value, "a torch.optim.lr_scheduler.LRScheduler (step, state_dict, "
                             "load_state_dict), or None")
    return value
