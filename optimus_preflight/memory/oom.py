"""``OOMObserver``: on a CUDA out-of-memory error, leave evidence and say what to change.

While enabled (``preflight.oom_observer=true``) the CUDA caching allocator records its
history with Python-only stacks (full C++ stacks make dumps take minutes). When an
allocation fails, the allocator calls the observer before the exception unwinds, with
everything still live; the observer writes

- ``oom/rank{r}_snapshot.pickle``: ``torch.cuda.memory._snapshot()``, loadable at
  https://pytorch.org/memory_viz;
- ``oom/rank{r}_summary.txt``: live bytes by category and the largest live allocations,

and logs a hint (the largest batch predicted to fit, bf16, activation checkpointing).
The allocator may call it more than once for one error (convolutions retry with less
workspace); only the first call writes.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.memory.advice import memory_hints
from optimus_preflight.memory.result import gib

log = logging.getLogger("optimus_preflight")

# Frame-based fallback labels, for blocks not matched to a known tensor.
_FRAME_RULES = (
    ("torch/optim/", "optimizer_state"),
    ("torch/autograd/", "backward_temporaries"),
)


def category_by_address(model: nn.Module | None, optimizer: Optimizer | None) -> dict[int, str]:
    """Storage base addresses of the live parameters, gradients and optimizer state."""
    addresses: dict[int, str] = {}

    def add(tensor: Any, category: str) -> None:
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            addresses.setdefault(tensor.untyped_storage().data_ptr(), category)

    if model is not None:
        for p in model.parameters():
            add(p, "params")
            add(p.grad, "grads")
        for b in model.buffers():
            add(b, "buffers")
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                add(value, "optimizer_state")
    return addresses


def _frame_category(frames: list[dict[str, Any]]) -> str:
    for frame in frames:
        filename, name = frame.get("filename", ""), frame.get("name", "")
        for marker, category in _FRAME_RULES:
            if marker in filename:
                return category
        if name == "forward":
            return "activations"
        if name == "backward":
            return "backward_temporaries"
    return "other"


def _user_frame(frames: list[dict[str, Any]]) -> str:
    """The innermost frame outside torch: where in the user's code the block was allocated."""
    for frame in frames:
        filename = frame.get("filename", "")
        if "/torch/" not in filename and not filename.startswith("<"):
            return f"{filename.split('/')[-1]}:{frame.get('line')}:{frame.get('name')}"
    return "?"


@dataclass
class SnapshotSummary:
    allocated_bytes: int
    reserved_bytes: int
    by_category: dict[str, int]
    largest: list[dict[str, Any]] = field(default_factory=list)
    oom_request_bytes: int | None = None
    device_free_bytes: int | None = None

    def format(self) -> str:
        lines = [f"allocated {gib(self.allocated_bytes)} in {gib(self.reserved_bytes)} of reserved segments"]
        if self.oom_request_bytes is not None:
            lines.append(
                f"failed request: {gib(self.oom_request_bytes)} with {gib(self.device_free_bytes or 0)} free on the device"
            )
        lines.append("live bytes by category:")
        for category, nbytes in sorted(self.by_category.items(), key=lambda item: -item[1]):
            lines.append(f"  {category:22s} {gib(nbytes):>12s}")
        lines.append("largest live allocations:")
        for block in self.largest:
            lines.append(f"  {gib(block['size']):>12s}  {block['category']:22s} {block['where']}")
        return "\n".join(lines) + "\n"


def summarize_snapshot(
    snapshot: dict[str, Any], categories: dict[int, str] | None = None, top: int = 10
) -> SnapshotSummary:
    """Totals and the largest live blocks of a ``torch.cuda.memory._snapshot()`` dict."""
    categories = categories or {}
    by_category: dict[str, int] = {}
    blocks: list[dict[str, Any]] = []
    reserved = 0
    for segment in snapshot.get("segments", []):
        reserved += segment.get("total_size", 0)
        for block in segment.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            frames = block.get("frames", [])
            category = categories.get(block.get("address")) or _frame_category(frames)
            by_category[category] = by_category.get(category, 0) + block["size"]
            blocks.append({"size": block["size"], "category": category, "where": _user_frame(frames)})
    blocks.sort(key=lambda block: -block["size"])
    summary = SnapshotSummary(sum(by_category.values()), reserved, by_category, blocks[:top])
    for trace in reversed(snapshot.get("device_traces", [])):
        ooms = [entry for entry in trace if entry.get("action") == "oom"]
        if ooms:
            summary.oom_request_bytes = ooms[-1].get("size")
            summary.device_free_bytes = ooms[-1].get("device_free")
            break
    return summary


def oom_hints(summary: SnapshotSummary, **kwargs: Any) -> list[str]:
    """Hints from the composition at the OOM (see ``memory_hints`` for the keywords)."""
    breakdown = {
        "params": summary.by_category.get("params", 0),
        "grads": summary.by_category.get("grads", 0),
        "optimizer_state": summary.by_category.get("optimizer_state", 0),
        "activations": summary.by_category.get("activations", 0),
        "other": sum(
            v for k, v in summary.by_category.items() if k not in ("params", "grads", "optimizer_state", "activations")
        ),
    }
    return memory_hints(breakdown, **kwargs)


class OOMObserver:
    """Records CUDA allocator history and, on OOM, writes a snapshot, a summary and a hint.

    ``start()`` returns False (and does nothing) without CUDA. ``hint_kwargs`` are
    passed to ``memory_hints`` (``precision``, ``batch_size``, ``largest_batch``, ...).
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        rank: int = 0,
        max_entries: int = 100_000,
        model: nn.Module | None = None,
        optimizer: Optimizer | None = None,
        hint_kwargs: dict[str, Any] | None = None,
        snapshot_fn: Callable[[], dict[str, Any]] | None = None,
    ):
        self.out_dir = Path(out_dir)
        self.rank = rank
        self.max_entries = max_entries
        self.model = model
        self.optimizer = optimizer
        self.hint_kwargs = hint_kwargs or {}
        self.snapshot_fn = snapshot_fn
        self.enabled = False
        self.fired = False
        self.written: list[Path] = []

    def start(self) -> bool:
        if not torch.cuda.is_available():
            log.info("OOMObserver: no CUDA device, nothing to observe")
            return False
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=self.max_entries
        )
        # The allocator keeps observers for the life of the process; `enabled` turns this one off.
        torch._C._cuda_attach_out_of_memory_observer(self.on_oom)
        self.enabled = True
        return True

    def stop(self) -> None:
        if self.enabled and torch.cuda.is_available():
            torch.cuda.memory._record_memory_history(enabled=None)
        self.enabled = False

    def on_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        if not self.enabled or self.fired:
            return
        self.fired = True
        try:
            snapshot = self.snapshot_fn() if self.snapshot_fn else torch.cuda.memory._snapshot()
            self.write(snapshot, request_bytes=alloc, device_free=device_free)
        except Exception as error:  # never mask the OOM itself
            log.warning("OOMObserver: could not write the OOM report: %s", error)

    def write(
        self, snapshot: dict[str, Any], *, request_bytes: int | None = None, device_free: int | None = None
    ) -> SnapshotSummary:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        pickle_path = self.out_dir / f"rank{self.rank}_snapshot.pickle"
        with open(pickle_path, "wb") as handle:
            pickle.dump(snapshot, handle)
        summary = summarize_snapshot(snapshot, category_by_address(self.model, self.optimizer))
        if request_bytes is not None and summary.oom_request_bytes is None:
            summary.oom_request_bytes, summary.device_free_bytes = request_bytes, device_free
        hints = oom_hints(summary, **self.hint_kwargs)
        summary_path = self.out_dir / f"rank{self.rank}_summary.txt"
        summary_path.write_text(summary.format() + "".join(f"hint: {hint}\n" for hint in hints), encoding="utf-8")
        self.written = [pickle_path, summary_path]
        log.error(
            "CUDA out of memory: snapshot %s (open it at https://pytorch.org/memory_viz), summary %s. %s",
            pickle_path,
            summary_path,
            " ".join(hints) or "Reduce data.batch_size.",
        )
        return summary


def start_oom_observer(
    cfg: Any,
    run_dir: str | Path,
    *,
    rank: int = 0,
    model: nn.Module | None = None,
    optimizer: Optimizer | None = None,
    precision: str | None = None,
    largest_batch: int | None = None,
) -> OOMObserver | None:
    """The observer the recipe attaches when ``preflight.oom_observer=true`` (None without
    CUDA or when disabled). ``precision`` is the resolved one; ``largest_batch`` is what the
    ``memory.vram_headroom`` check found (``artifacts["memory.largest_micro_batch"]``)."""
    if not cfg.preflight.oom_observer:
        return None
    observer = OOMObserver(
        Path(run_dir) / "oom",
        rank=rank,
        model=model,
        optimizer=optimizer,
        hint_kwargs={
            "precision": precision or str(cfg.trainer.precision),
            "batch_size": int(cfg.data.batch_size),
            "accumulation_steps": int(cfg.trainer.accumulation_steps),
            "largest_batch": largest_batch,
        },
    )
    return observer if observer.start() else None
