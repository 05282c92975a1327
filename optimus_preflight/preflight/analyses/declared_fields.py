"""The settings a user's loss function or model carries with it: an object's attributes, a
function's closure variables, the module constants its code names and its keyword defaults, a
bound method's object's (what a check can read of ``q=0.9`` or ``warmup_steps=...`` without
running anything)."""

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
    if code is not None:
        # Module-level constants the function's code names (TAU = 0.9 above the loss), and its
        # keyword defaults (def pinball(pred, y, tau=0.9)): settings as much as a closure's.
        scope = getattr(owner, "__globals__", {})
        fields.update({name: scope[name] for name in code.co_names
                       if name in scope and isinstance(scope[name], (int, float, str)) and name not in fields})
        defaults = getattr(owner, "__defaults__", None) or ()
        names = code.co_varnames[:code.co_argcount]
        fields.update({name: value for name, value in zip(names[len(names) - len(defaults):], defaults, strict=False)
                       if isinstance(value, (int, float, str))})
    if code is not None and cells:
        for name, cell in zip(code.co_freevars, cells, strict=False):
            try:
                fields[name] = cell.cell_contents
            except ValueError:  # an empty cell
                continue
    return fields
