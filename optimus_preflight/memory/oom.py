"""The OOM recorder: on a CUDA out-of-memory error, leave evidence and say what to change.

While started (``preflight.oom_observer=true``), the CUDA caching allocator records its
history with Python-only stacks (full C++ stacks make dumps take minutes). When an
allocation fails, the allocator calls the recorder before the exception unwinds, with
everything still live. The recorder then writes these files in ``folder``, each name
starting with ``prefix``:

- ``<prefix>_snapshot.pickle``: ``torch.cuda.memory._snapshot()``; open it at
  https://pytorch.org/memory_viz.
- ``<prefix>_trace_plot.html`` and ``<prefix>_segment_plot.html``: torch's
  ``trace_plot`` and ``segment_plot``. The snapshot is embedded in each page, but the
  page imports MemoryViz.js from cdn.jsdelivr.net when a browser opens it. So viewing
  needs a network connection; writing them does not.
- ``<prefix>_segment_flamegraph.svg`` and ``<prefix>_memory_flamegraph.svg``:
  torch's ``segments`` and ``memory`` folded stacks. A local ``flamegraph.pl`` draws
  them if one is on PATH or in torch's cache, and ``flamegraph_svg`` draws them
  otherwise. Torch's default formatter is never used, because it downloads
  ``flamegraph.pl`` from GitHub when the script is missing.
- ``<prefix>_summary.txt``: live bytes by category, the largest live allocations, and hints.

It also logs the hints: the largest batch predicted to fit, bf16, activation
checkpointing. Each file is written on its own, so one that fails is logged and the rest
are still written. Nothing raised while writing them hides the OOM. The allocator may
call the recorder more than once for one error (convolutions retry with less workspace),
and only the first call writes.

One module, longer than most: the snapshot summary and hints exist only to be written by
the recorder at the OOM, and read best next to it.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn
from torch.cuda import _memory_viz
from torch.optim import Optimizer

from optimus_preflight.memory.advice import memory_hints
from optimus_preflight.memory.oom_files import (
    OOMArtifacts,
    ensure_folder_is_empty,
    flamegraph_formatter,
    local_flamegraph_script,
    write_artifact,
)
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


class OOMRecorder:
    """Records CUDA allocator history and, on an OOM, writes the snapshot, its trace and
    segment plots and flamegraphs, a summary and a hint, as ``folder/prefix_*``.

    ``max_entries``: the allocator events kept. With ``overwrite=False`` the folder must
    be empty: ``start()`` raises FileExistsError if it is not. ``model`` and ``optimizer``
    let the summary tell parameters, gradients and optimizer state apart. ``hint_kwargs``
    go to ``memory_hints`` (``precision``, ``batch_size``, ``largest_batch``, ...).
    ``snapshot_fn`` replaces ``torch.cuda.memory._snapshot``, for tests.

    ``start()`` returns False, and does nothing, without CUDA. After an OOM, ``written``
    lists the files written and ``failed`` the files that could not be written.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        prefix: str,
        *,
        max_entries: int = 100_000,
        overwrite: bool = False,
        model: nn.Module | None = None,
        optimizer: Optimizer | None = None,
        hint_kwargs: dict[str, Any] | None = None,
        snapshot_fn: Callable[[], dict[str, Any]] | None = None,
    ):
        if not prefix:
            raise ValueError("the OOM recorder needs a prefix to name its files, e.g. 'rank0_oom'")
        self.max_entries = max_entries
        self.overwrite = overwrite
        self.model = model
        self.optimizer = optimizer
        self.hint_kwargs = hint_kwargs or {}
        self.snapshot_fn = snapshot_fn
        self.folder_path = Path(folder)
        self.artifacts = OOMArtifacts.from_prefix(self.folder_path / prefix)
        self.enabled = False
        self.fired = False
        self.written: list[Path] = []
        self.failed: list[Path] = []

    def check_folder(self) -> None:
        """With ``overwrite=False``, raise FileExistsError unless the trace folder is empty.

        ``start()`` checks once and ``write()`` does not check again.
        By the time of an OOM, the folder may hold another rank's files: the default
        folder is shared by all ranks.
        """
        if not self.overwrite:
            ensure_folder_is_empty(self.folder_path)

    def start(self) -> bool:
        if self.enabled:
            return True
        # Checked before CUDA, so a folder that would refuse the traces fails on a CPU
        # rehearsal too, and not only on the GPU job.
        self.check_folder()
        if not torch.cuda.is_available():
            log.info("OOM recorder: no CUDA device, nothing to observe")
            return False
        # Created now: a folder that cannot be made should fail the start, not the OOM handler.
        self.folder_path.mkdir(parents=True, exist_ok=True)
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
            log.warning("OOM recorder: could not write the OOM report: %s", error)

    def write(
        self, snapshot: dict[str, Any], request_bytes: int | None = None, device_free: int | None = None
    ) -> SnapshotSummary | None:
        """Write every file for ``snapshot``. Return its summary, or None if it could not be made."""
        paths = self.artifacts
        paths.snapshot.parent.mkdir(parents=True, exist_ok=True)
        script = local_flamegraph_script()
        self.written, self.failed = [], []
        summary: SnapshotSummary | None = None
        hints: list[str] = []
        try:
            summary = summarize_snapshot(snapshot, category_by_address(self.model, self.optimizer))
            if request_bytes is not None and summary.oom_request_bytes is None:
                summary.oom_request_bytes, summary.device_free_bytes = request_bytes, device_free
            hints = oom_hints(summary, **self.hint_kwargs)
        except Exception as error:
            log.warning("OOM recorder: could not summarize the snapshot: %s: %s", type(error).__name__, error)

        def summary_text() -> str:
            if summary is None:
                raise ValueError("no summary (see the warning above)")
            return summary.format() + "".join(f"hint: {hint}\n" for hint in hints)

        renderers: dict[Path, Callable[[], str | bytes]] = {
            # First: the snapshot is the evidence every other file is drawn from.
            paths.snapshot: lambda: pickle.dumps(snapshot),
            paths.trace_plot: lambda: _memory_viz.trace_plot(snapshot),
            paths.segment_plot: lambda: _memory_viz.segment_plot(snapshot),
            paths.segment_flamegraph: lambda: _memory_viz.segments(
                snapshot, format_flamegraph=flamegraph_formatter("Allocator segments at the OOM", script)
            ),
            paths.memory_flamegraph: lambda: _memory_viz.memory(
                snapshot, format_flamegraph=flamegraph_formatter("Live memory at the OOM", script)
            ),
            paths.summary: summary_text,
        }
        for path, render in renderers.items():
            try:
                write_artifact(path, render)
                self.written.append(path)
            except Exception as error:
                self.failed.append(path)
                log.warning("OOM recorder: could not write %s: %s: %s", path, type(error).__name__, error)
        log.error(
            "CUDA out of memory: wrote %d of %d files to %s (open %s at https://pytorch.org/memory_viz; "
            "the HTML plots load MemoryViz.js from a CDN when opened), summary %s. %s",
            len(self.written),
            len(renderers),
            self.folder_path,
            paths.snapshot.name,
            paths.summary.name,
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
) -> OOMRecorder | None:
    """The recorder the recipe attaches when ``preflight.oom_observer=true`` (None without
    CUDA or when disabled). ``precision`` is the resolved one; ``largest_batch`` is what the
    ``memory.vram_headroom`` check found (``artifacts["memory.largest_micro_batch"]``).

    The files go to ``<run_dir>/oom/rank<r>_oom_*``. The folder may already hold files,
    because a resumed run reuses its run directory and the OOM that stopped the previous
    attempt left its files there, so overwrite is on: a new OOM replaces that rank's old
    files, which have the same names, and the newest OOM is the one to act on.
    """
    if not cfg.preflight.oom_observer:
        return None
    recorder = OOMRecorder(
        Path(run_dir) / "oom",
        f"rank{rank}_oom",
        overwrite=True,
        model=model,
        optimizer=optimizer,
        hint_kwargs={
            "precision": precision or str(cfg.trainer.precision),
            "batch_size": int(OmegaConf.select(cfg, "data.batch_size", default=None) or 1),
            "accumulation_steps": int(cfg.trainer.accumulation_steps),
            "largest_batch": largest_batch,
        },
    )
    return recorder if recorder.start() else None
