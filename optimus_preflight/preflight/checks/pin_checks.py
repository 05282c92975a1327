"""DP5: ``pin_memory=True`` with a batch type the DataLoader's pin step cannot see into.

torch 2.13's pin step (torch/utils/data/_utils/pin_memory.py) pins tensors, recurses
into mappings and sequences, and calls a ``pin_memory()`` method where an object has one;
any other object is handed back as it is, without a warning. The tensors of a custom
batch type (a dataclass, a ``Batch`` class) then stay in pageable memory, and
``.to(device, non_blocking=True)`` copies them synchronously. Read from the first batch;
nothing is pinned (a CPU run pins nothing, and is left alone).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

# A container's first SEARCH_WIDTH items stand for the rest.
SEARCH_WIDTH = 64


def _attributes(obj: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return dict(getattr(obj, "__dict__", {}))


def _holds_tensor(value: Any, depth: int = 3) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if depth == 0 or isinstance(value, (str, bytes)):
        return False
    if isinstance(value, Mapping):
        items = value.values()
    elif isinstance(value, Sequence):
        items = value
    else:
        items = _attributes(value).values()
    return any(_holds_tensor(item, depth - 1) for item in itertools.islice(items, SEARCH_WIDTH))


@dataclass(frozen=True)
class Unpinned:
    path: str  # "batch", "batch['graph']"
    kind: str  # its type's name
    tensors: tuple[str, ...]  # attributes that are tensors
    nested: tuple[str, ...] = ()  # attributes that hold tensors inside containers


def unpinnable_parts(batch: Any, path: str = "batch", depth: int = 4) -> list[Unpinned]:
    """Each object in ``batch`` that the DataLoader's ``pin_memory``
    (torch/utils/data/_utils/pin_memory.py) returns as it is although it holds tensors:
    neither a tensor, a mapping nor a sequence, and without a ``pin_memory()`` method."""
    if depth < 0 or isinstance(batch, (torch.Tensor, str, bytes)) or hasattr(batch, "pin_memory"):
        return []
    if isinstance(batch, Mapping):
        items: Any = ((f"{path}[{key!r}]", value) for key, value in batch.items())
    elif isinstance(batch, Sequence):
        items = ((f"{path}[{index}]", value) for index, value in enumerate(batch))
    else:
        attributes = _attributes(batch)
        tensors = tuple(name for name, value in attributes.items() if isinstance(value, torch.Tensor))
        nested = tuple(name for name, value in attributes.items()
                       if not isinstance(value, torch.Tensor) and _holds_tensor(value))
        return [Unpinned(path, type(batch).__qualname__, tensors, nested)] if tensors or nested else []
    found = []
    for sub_path, value in itertools.islice(items, SEARCH_WIDTH):
        found.extend(unpinnable_parts(value, sub_path, depth - 1))
    return found


def pin_method_fix(part: Unpinned) -> str:
    """The ``pin_memory`` method the batch type needs, with its own field names."""
    pins = "".join(f"self.{name} = self.{name}.pin_memory(); " for name in part.tensors)
    nested = (f" (and pin the tensors inside {', '.join(part.nested)} the same way)" if part.nested else "")
    return (f"Give {part.kind} a method `def pin_memory(self): {pins}return self`{nested}; the DataLoader's pin "
            "thread calls it on every batch and uses what it returns. Or have the collate_fn return a dict or tuple "
            "of tensors.")


class PinnedBatchCheck(Check):
    """DP5: pin_memory=True with a batch type the DataLoader's pin step cannot see into."""

    name = "data.pin_memory"
    stage = Stage.DATA
    codes = ("DP5",)
    requires = ("data.first_batch",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if not getattr(ctx.train_loader, "pin_memory", False):
            findings.data["summary"] = "pin_memory=False"
            return
        if ctx.device.type == "cpu":  # nothing is pinned on a CPU run, and nothing needs to be
            findings.data["summary"] = "not applicable (training on the CPU)"
            return
        parts = unpinnable_parts(ctx.artifacts.first_batch)
        findings.data["unpinned"] = [f"{part.path} ({part.kind})" for part in parts]
        findings.data["summary"] = "every tensor of the batch is pinned" if not parts else f"{len(parts)} unpinned part(s)"
        if not parts:
            return
        part = parts[0]
        fields = ", ".join((*part.tensors, *part.nested)[:6])
        fix = pin_method_fix(part)
        findings.warning(
            "DP5",
            f"pin_memory=True, but {part.path} is a {part.kind}, a type the DataLoader cannot pin (it pins tensors, "
            "recurses into dicts, lists and tuples, and calls a pin_memory() method where one exists): the tensors "
            f"in {fields} stay in pageable memory, so .to('{ctx.device.type}', non_blocking=True) copies them "
            "synchronously and the copy no longer overlaps compute",
            fix, None, code_fix=fix)
