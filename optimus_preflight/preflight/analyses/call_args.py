"""Reading one argument of a torch call seen by a ``TorchFunctionMode`` (positional or keyword)."""

from __future__ import annotations

from typing import Any

import torch


def argument(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    """The call's argument ``name``, passed at position ``index`` or by keyword."""
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def touches_sparse(args: tuple, kwargs: dict, out: Any = None) -> bool:
    """Whether a call reads or returns a sparse tensor (a GCN's torch.sparse adjacency): the
    watches read dense values and leave such a call unread."""
    values = (*args[:3], *kwargs.values(), out)
    return any(getattr(value, "layout", torch.strided) != torch.strided for value in values
               if isinstance(value, torch.Tensor))
