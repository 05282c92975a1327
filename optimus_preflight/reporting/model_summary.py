"""What the model is made of: parameters and bytes per top-level child, trainable vs frozen.

Nothing here reads a tensor's data (sizes are numel * element_size), so it works on a
meta-device model before materialisation and on FSDP2 DTensors, whose numel is global.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import nn

from optimus_preflight.reporting.summary import write_json_atomic, write_text_atomic

ROOT_ROW = "(root)"  # parameters and buffers registered on the model itself, not on a child
_MAX_UNWRAP = 8


@dataclass(frozen=True)
class ModuleRow:
    name: str
    type: str
    trainable: int
    frozen: int
    bytes: int  # parameters and buffers

    @property
    def params(self) -> int:
        return self.trainable + self.frozen

    @property
    def frozen_entirely(self) -> bool:
        return self.frozen > 0 and self.trainable == 0


@dataclass(frozen=True)
class ModelSummary:
    model_type: str
    rows: tuple[ModuleRow, ...]
    trainable: int
    frozen: int
    param_bytes: int
    buffer_bytes: int
    wrappers: tuple[str, ...] = ()  # outermost first, e.g. ("OptimizedModule", "DistributedDataParallel")

    @property
    def total(self) -> int:
        return self.trainable + self.frozen

    @property
    def bytes(self) -> int:
        return self.param_bytes + self.buffer_bytes

    @property
    def frozen_modules(self) -> list[str]:
        return [row.name for row in self.rows if row.frozen_entirely]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_type": self.model_type,
            "wrappers": list(self.wrappers),
            "modules": [dataclasses.asdict(row) for row in self.rows],
            "trainable": self.trainable,
            "frozen": self.frozen,
            "total": self.total,
            "param_bytes": self.param_bytes,
            "buffer_bytes": self.buffer_bytes,
            "bytes": self.bytes,
            "frozen_modules": self.frozen_modules,
        }


def unwrap_model(model: Any) -> tuple[nn.Module, tuple[str, ...]]:
    """The user's module inside torch.compile / DDP / DataParallel / FSDP1 wrappers."""
    wrappers: list[str] = []
    for _ in range(_MAX_UNWRAP):
        inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if not isinstance(inner, nn.Module):
            inner = getattr(model, "module", None)
            # A user model may have a child that happens to be called `module`: only a
            # wrapper holds it as its one child and nothing of its own.
            if isinstance(inner, nn.Module) and isinstance(model, nn.Module):
                own = list(model.parameters(recurse=False)) + list(model.buffers(recurse=False))
                if own or [id(child) for child in model.children()] != [id(inner)]:
                    inner = None
        if not isinstance(inner, nn.Module):
            break
        wrappers.append(type(model).__name__)
        model = inner
    if not isinstance(model, nn.Module):
        raise TypeError(f"summarize_model needs an nn.Module (or a wrapper with .module), got {type(model).__name__}")
    return model, tuple(wrappers)


def _nbytes(tensor: torch.Tensor) -> int:
    # numel * element_size, never .data: meta tensors have no data, DTensors no local global copy.
    return tensor.numel() * tensor.element_size()


def _count(params: Iterable[nn.Parameter], buffers: Iterable[torch.Tensor], seen: set[int]) -> tuple[int, int, int, int]:
    """(trainable, frozen, param bytes, buffer bytes) of tensors not counted before."""
    trainable = frozen = param_bytes = buffer_bytes = 0
    for param in params:
        if id(param) in seen:  # tied weights (an embedding shared with the head) count once
            continue
        seen.add(id(param))
        if param.requires_grad:
            trainable += param.numel()
        else:
            frozen += param.numel()
        param_bytes += _nbytes(param)
    for buffer in buffers:
        if id(buffer) not in seen:
            seen.add(id(buffer))
            buffer_bytes += _nbytes(buffer)
    return trainable, frozen, param_bytes, buffer_bytes


def summarize_model(model: nn.Module) -> ModelSummary:
    """Parameter counts and sizes per top-level child (first owner of a tied weight counts it)."""
    module, wrappers = unwrap_model(model)
    seen: set[int] = set()
    rows: list[ModuleRow] = []
    param_bytes = buffer_bytes = 0
    parts = [(ROOT_ROW, module, False)] + [(name, child, True) for name, child in module.named_children()]
    for name, part, recurse in parts:
        trainable, frozen, p_bytes, b_bytes = _count(part.parameters(recurse=recurse), part.buffers(recurse=recurse), seen)
        param_bytes += p_bytes
        buffer_bytes += b_bytes
        # The root row exists only when the model registers tensors of its own.
        if recurse or trainable or frozen or b_bytes:
            rows.append(ModuleRow(name, type(part).__name__, trainable, frozen, p_bytes + b_bytes))
    return ModelSummary(
        model_type=type(module).__name__,
        rows=tuple(rows),
        trainable=sum(row.trainable for row in rows),
        frozen=sum(row.frozen for row in rows),
        param_bytes=param_bytes,
        buffer_bytes=buffer_bytes,
        wrappers=wrappers,
    )


def _scaled(value: int, base: int, units: tuple[str, ...], first: str) -> str:
    if value < base:
        return f"{value}{first}"
    scaled = float(value)
    for unit in units:
        scaled /= base
        # Move up a unit when rounding would print "1000.0 K" / "1024.0 KiB".
        if round(scaled, 1) < base or unit == units[-1]:
            return f"{scaled:.1f} {unit}"
    raise AssertionError("unreachable")


def human_count(value: int) -> str:
    """330, 23.5 K, 1.2 M, 7.0 B."""
    return _scaled(value, 1000, ("K", "M", "B", "T"), "")


def human_bytes(value: int) -> str:
    """512 B, 92.0 KiB, 1.5 GiB."""
    return _scaled(value, 1024, ("KiB", "MiB", "GiB", "TiB"), " B")


def format_model_summary(summary: ModelSummary, max_rows: int = 20) -> str:
    """An aligned table, one row per top-level child, the totals last."""
    rows = list(summary.rows)
    shown = [(row.name, row.type, row.trainable, row.frozen, row.bytes) for row in rows[:max_rows]]
    hidden = rows[max_rows:]
    if hidden:
        sums = [sum(getattr(row, key) for row in hidden) for key in ("trainable", "frozen", "bytes")]
        shown.append((f"... {len(hidden)} more", "", *sums))
    shown.append(("total", "", summary.trainable, summary.frozen, summary.bytes))
    table = [("module", "type", "trainable", "frozen", "size")]
    table += [(name, kind, human_count(t), human_count(f), human_bytes(b)) for name, kind, t, f, b in shown]
    widths = [max(len(cells[i]) for cells in table) for i in range(5)]
    lines = []
    for cells in table:
        left = [cells[i].ljust(widths[i]) for i in (0, 1)]
        right = [cells[i].rjust(widths[i]) for i in (2, 3, 4)]
        lines.append("  ".join(left + right))
    frozen = summary.frozen_modules
    if frozen:
        lines[-1] += f" ({len(frozen)} module(s) frozen entirely: {', '.join(frozen)})"
    return "\n".join(lines) + "\n"


def write_model_summary(summary: ModelSummary, run_dir: Path) -> None:
    """model_summary.json and model_summary.txt in ``run_dir``; readers never see half a file."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "model_summary.json", summary.to_dict())
    write_text_atomic(run_dir / "model_summary.txt", format_model_summary(summary))
