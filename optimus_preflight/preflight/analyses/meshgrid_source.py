"""Coordinate grids named x and y the other way round (pure, on the source of the user's classes).

``torch.meshgrid(a, b)`` defaults to ``indexing='ij'``: its first grid varies along the rows,
i.e. it is the y coordinate of a row-major map. NumPy's ``np.meshgrid`` defaults to 'xy',
where the first grid varies along the columns. Code written with NumPy's habit,
``gx, gy = torch.meshgrid(xs, ys)``, names the row grid x: a soft-argmax or a coordinate
channel built from it returns (row, column) where (x, y) was meant. Grids built once in
``__init__`` and kept as buffers never pass through a step, so the lines are read instead: an
assignment that unpacks a ``torch.meshgrid`` call into names for x then y under 'ij' (or y then
x under 'xy'). ``yy, xx = torch.meshgrid(ys, xs)`` is the 'ij' convention written right.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from dataclasses import dataclass
from typing import Any

_AXIS = re.compile(r"^_*(?:g|grid|pos|coord|coords|mesh|base|ref)?_?(?P<axis>x|y)(?P=axis)?s?_*"
                   r"(?:grid|grids|coord|coords|pos|mesh|range|lin|idx)?\d*$", re.IGNORECASE)


@dataclass(frozen=True)
class SwappedGrids:
    where: str  # Class.method
    line: str  # the source line
    indexing: str  # the effective one: 'ij' (torch's default) or 'xy'
    x_name: str  # the name the grid of row coordinates (under 'ij') or column ones was given
    conditional: bool  # the line sits under an if: another branch may build the grids right


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def grid_orientation(tensor: object) -> str | None:
    """'rows' when a square coordinate grid (H, W), or its flattening, varies along the rows
    only, 'columns' when along the columns only; None for anything else."""
    import torch

    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() and tensor.dtype not in (
            torch.int32, torch.int64):
        return None
    if tensor.dim() == 1:
        side = int(round(tensor.numel() ** 0.5))
        if side < 2 or side * side != tensor.numel():
            return None
        tensor = tensor.reshape(side, side)
    if tensor.dim() != 2 or min(tensor.shape) < 2:
        return None
    along_rows = bool((tensor == tensor[:, :1]).all())  # each row constant: the value changes from row to row
    along_columns = bool((tensor == tensor[:1, :]).all())
    if along_rows != along_columns:
        return "rows" if along_rows else "columns"
    return None


def _axis(node: ast.AST) -> str | None:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    match = _AXIS.match(name) if name else None
    return match.group("axis").lower() if match else None


def _indexing(call: ast.Call) -> str | None:
    for keyword in call.keywords:
        if keyword.arg == "indexing":
            return keyword.value.value if isinstance(keyword.value, ast.Constant) and isinstance(
                keyword.value.value, str) else None
    return "ij"


def _is_torch_meshgrid(call: ast.AST) -> bool:
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "meshgrid" \
        and isinstance(call.func.value, ast.Name) and call.func.value.id == "torch"


def swapped_grids(obj: Any) -> list[SwappedGrids]:
    """The ``torch.meshgrid`` unpackings in ``obj``'s source (a class or a function) whose names
    read the grids in the other order than the indexing gives them."""
    try:
        source = textwrap.dedent(inspect.getsource(obj))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return []
    lines = source.splitlines()
    conditional = {id(inner) for node in ast.walk(tree) if isinstance(node, (ast.If, ast.IfExp))
                   for inner in ast.walk(node)}
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if not isinstance(node, ast.Assign) or len(node.targets) != 1 or not _is_torch_meshgrid(node.value):
                continue
            target = node.targets[0]
            if not isinstance(target, (ast.Tuple, ast.List)) or len(target.elts) != 2:
                continue
            axes = (_axis(target.elts[0]), _axis(target.elts[1]))
            indexing = _indexing(node.value)
            if (indexing, axes) in (("ij", ("x", "y")), ("xy", ("y", "x"))):
                owner = getattr(obj, "__qualname__", getattr(obj, "__name__", "?"))
                where = owner if function.name == getattr(obj, "__name__", None) else f"{owner}.{function.name}"
                x_name = _name(target.elts[0] if axes[0] == "x" else target.elts[1])
                found.append(SwappedGrids(where, lines[node.lineno - 1].strip(), indexing, x_name,
                                          id(node) in conditional))
    return found


def user_code(model: Any, loss_fn: Any = None) -> list[Any]:
    """The classes of the model's modules and the loss that the user wrote (not torch's, not a
    library's installed under site-packages), each once."""
    seen: list[Any] = []
    candidates = [type(module) for module in model.modules()] if hasattr(model, "modules") else []
    if loss_fn is not None:
        candidates.append(loss_fn if inspect.isfunction(loss_fn) else type(loss_fn))
    for candidate in candidates:
        module_name = getattr(candidate, "__module__", "") or ""
        if module_name.split(".")[0] in ("torch", "transformers", "torchvision", "torchaudio", "timm", "builtins",
                                               "optimus_preflight") \
                or candidate in seen:
            continue
        try:
            path = inspect.getsourcefile(candidate) or ""
        except TypeError:
            continue
        if "site-packages" in path:
            continue
        seen.append(candidate)
    return seen
