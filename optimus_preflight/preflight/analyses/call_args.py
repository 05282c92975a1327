"""Reading one argument of a torch call seen by a ``TorchFunctionMode`` (positional or keyword)."""

from __future__ import annotations

from typing import Any


def argument(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    """The call's argument ``name``, passed at position ``index`` or by keyword."""
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)
