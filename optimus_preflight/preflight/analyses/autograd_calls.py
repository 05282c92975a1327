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


@contextmanager
def watched_autograd_grad(calls: list[bool], force_graph: bool) -> Iterator[None]:
    """``torch.autograd.grad`` recording each call's ``create_graph`` (and, with
    ``force_graph``, turning it on); the user's ``torch.autograd.grad(...)`` looks the
    function up at call time, so it goes through here."""
    real = torch.autograd.grad

    def grad(outputs: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        create = kwargs.get("create_graph", args[_CREATE_GRAPH] if len(args) > _CREATE_GRAPH else False)
        calls.append(bool(create))
        if force_graph and not create:
            if len(args) > _CREATE_GRAPH:
                args = (*args[:_CREATE_GRAPH], True, *args[_CREATE_GRAPH + 1:])
            else:
                kwargs["create_graph"] = True
        return real(outputs, inputs, *args, **kwargs)

    torch.autograd.grad = grad
    try:
        yield
    finally:
        torch.autograd.grad = real
