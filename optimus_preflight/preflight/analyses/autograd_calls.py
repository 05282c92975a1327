"""``torch.autograd.grad`` calls made inside the user's ``compute_loss``, watched.

The probe records each call's ``create_graph`` during the first step; ``step.derivative_graph``
re-runs the loss with it forced on, to see whether the weights' gradient depends on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

_CREATE_GRAPH = 2  # torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph, create_graph, ...)


MIN_VALUES = 8  # a derivative this small (a scalar's) says nothing by being zero


def all_zero(results: Any) -> bool:
    """Every derivative a call returned is exactly zero (or absent, ``allow_unused``) over a
    real number of points."""
    tensors = [r for r in (results if isinstance(results, (tuple, list)) else (results,)) if isinstance(r, torch.Tensor)]
    return sum(t.numel() for t in tensors) >= MIN_VALUES and all(not bool(t.detach().any()) for t in tensors)


def _tensors(value: Any) -> list[torch.Tensor]:
    return [v for v in (value if isinstance(value, (tuple, list)) else (value,)) if isinstance(v, torch.Tensor)]


@contextmanager
def watched_autograd_grad(calls: list[bool], force_graph: bool, zero: list[bool] | None = None,
                          fields: list[bool] | None = None,
                          whole_gradients: list[tuple[int, ...]] | None = None) -> Iterator[None]:
    """``torch.autograd.grad`` recording each call's ``create_graph`` (and, with
    ``force_graph``, turning it on), into ``zero`` whether all it returned was zero, and into
    ``fields`` whether it differentiated a field (one value per point, as a PINN's u or u_x)
    rather than a scalar loss; the user's ``torch.autograd.grad(...)`` looks the function up at
    call time, so it goes through here. Into ``whole_gradients``: the shape of an earlier call's
    result of two or more columns differentiated again as a whole, with respect to the same
    inputs (a Laplacian's u_xx taken of [u_x, u_t] at once: it sums the Hessian's columns)."""
    real = torch.autograd.grad
    earlier: list[tuple[torch.Tensor, set[int]]] = []

    def grad(outputs: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        create = kwargs.get("create_graph", args[_CREATE_GRAPH] if len(args) > _CREATE_GRAPH else False)
        calls.append(bool(create))
        if fields is not None:
            first = outputs[0] if isinstance(outputs, (tuple, list)) and outputs else outputs
            fields.append(isinstance(first, torch.Tensor) and first.numel() > 1)
        if force_graph and not create:
            if len(args) > _CREATE_GRAPH:
                args = (*args[:_CREATE_GRAPH], True, *args[_CREATE_GRAPH + 1:])
            else:
                kwargs["create_graph"] = True
        results = real(outputs, inputs, *args, **kwargs)
        if zero is not None:
            zero.append(all_zero(results))
        if whole_gradients is not None:
            sources = {id(t) for t in _tensors(inputs)}
            for output in _tensors(outputs):
                whole_gradients.extend(tuple(output.shape) for result, wrt in earlier
                                       if result is output and wrt & sources and output.dim() == 2
                                       and output.shape[1] >= 2)
            earlier.extend((result, sources) for result in _tensors(results))
        return results

    torch.autograd.grad = grad
    try:
        yield
    finally:
        torch.autograd.grad = real
