"""The settings a user's loss function or model carries with it: an object's attributes, a
function's closure variables, a bound method's object's (what a check can read of ``q=0.9``
or ``warmup_steps=...`` without running anything)."""

from __future__ import annotations

from typing import Any

from torch import nn


def declared_fields(owner: Any) -> dict[str, Any]:
    owner = getattr(owner, "__self__", owner)
    fields: dict[str, Any] = {}
    if isinstance(owner, nn.Module):
        fields.update({k: v for k, v in vars(owner).items() if not k.startswith("_")})
    elif hasattr(owner, "__dict__") and not isinstance(owner, type):
        fields.update(vars(owner))
    code, cells = getattr(owner, "__code__", None), getattr(owner, "__closure__", None)
    if code is not None and cells:
        for name, cell in zip(code.co_freevars, cells, strict=False):
            try:
                fields[name] = cell.cell_contents
            except ValueError:  # an empty cell
                continue
    return fields
