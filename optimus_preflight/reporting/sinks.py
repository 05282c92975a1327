"""Metric records and the sinks they go to (metrics.jsonl, TensorBoard)."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Protocol

import psutil
import torch

from optimus_preflight.errors import StorageError
from optimus_preflight.reporting.json_records import dumps
from optimus_preflight.reporting.summary import write_text_atomic

log = logging.getLogger(__name__)


class MetricSink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def drop_records_after(path: Path, step: int) -> int:
    """Remove the records of steps after ``step`` from a metrics.jsonl (and a last line a
    kill cut short): a run resumed from the checkpoint of ``step`` logs those steps
    again, and a reader must not find one step twice. Returns how many were dropped.

    The file is replaced atomically: a crash midway leaves the old one whole.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except FileNotFoundError:
        return 0
    except OSError as error:
        raise StorageError.from_os_error(error, path.name, path.parent) from None
    kept = [line for line in lines if _kept(line, step)]
    if len(kept) == len(lines):
        return 0
    try:
        write_text_atomic(path, "".join(kept))
    except OSError as error:
        raise StorageError.from_os_error(error, path.name, path.parent) from None
    return len(lines) - len(kept)


def _kept(line: str, step: int) -> bool:
    if not line.endswith("\n"):
        return False  # cut short by a kill: the next record would be glued onto it
    try:
        record = json.loads(line)
    except ValueError:
        return False
    record_step = record.get("step") if isinstance(record, dict) else None
    return not (isinstance(record_step, int) and record_step > step)


class JsonlSink:
    """Appends one JSON object per line; flushes on a timer, not per record, because
    a flush per step is a measurable cost in a fast loop.

    ``after_step``: the step training continues from; records of later steps, left by
    a run that stopped after its last checkpoint, are dropped first.
    """

    def __init__(self, path: Path, flush_every_s: float = 5.0, *, after_step: int | None = None):
        self.path = path
        self.flush_every_s = flush_every_s
        if after_step is not None and (dropped := drop_records_after(path, after_step)):
            log.info("%s: dropped %d record(s) after step %d, which this run logs again", path.name, dropped, after_step)
        self._file = open(path, "a", encoding="utf-8")
        self._last_flush = time.monotonic()

    def write(self, record: dict[str, Any]) -> None:
        try:
            self._file.write(dumps(record) + "\n")
            now = time.monotonic()
            if now - self._last_flush >= self.flush_every_s:
                self._file.flush()
                self._last_flush = now
        except OSError as error:
            raise StorageError.from_os_error(error, self.path.name, self.path.parent) from None

    def flush(self) -> None:
        try:
            self._file.flush()
        except OSError as error:
            raise StorageError.from_os_error(error, self.path.name, self.path.parent) from None

    def sync(self) -> None:
        """Flush and fsync: the records so far survive a SIGKILL or a power cut."""
        if self._file.closed:
            return
        self.flush()
        try:
            os.fsync(self._file.fileno())
        except OSError as error:
            raise StorageError.from_os_error(error, self.path.name, self.path.parent) from None

    def close(self) -> None:
        """Never raises: it runs while a run is already stopping, maybe for this very disk."""
        if self._file.closed:
            return
        try:
            self._file.close()
        except OSError as error:
            log.error("the last records of %s could not be written: %s", self.path, error)


class TensorBoardSink:
    def __init__(self, log_dir: Path, *, after_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step hides the events of the steps this run logs again (see JsonlSink).
        purge = after_step + 1 if after_step is not None else None
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge)

    def write(self, record: dict[str, Any]) -> None:
        step = record.get("step", 0)
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(key, value, step)

    def histogram(self, tag: str, values: torch.Tensor, step: int) -> None:
        self._writer.add_histogram(tag, values.detach().float().cpu(), step)

    def close(self) -> None:
        self._writer.close()


def make_tensorboard_sink(log_dir: Path, *, after_step: int | None = None) -> TensorBoardSink | None:
    try:
        return TensorBoardSink(log_dir, after_step=after_step)
    except ImportError:
        log.warning(
            "logging.tensorboard=true but the tensorboard package is not installed; "
            "install it with `pip install tensorboard` (or the [tensorboard] extra). "
            "Continuing without TensorBoard."
        )
        return None


class MetricsLogger:
    def __init__(self, sinks: list[MetricSink]):
        self.sinks = sinks

    def log(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(record)

    def flush(self) -> None:
        for sink in self.sinks:
            if hasattr(sink, "flush"):
                sink.flush()

    def sync(self) -> None:
        """Make every record so far durable (called as a checkpoint is written: what a
        resume continues from is then on disk in the metric files too)."""
        for sink in self.sinks:
            if hasattr(sink, "sync"):
                sink.sync()
            elif hasattr(sink, "flush"):
                sink.flush()

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def memory_metrics(device: torch.device) -> dict[str, int]:
    record = {"memory/host_rss_bytes": psutil.Process().memory_info().rss}
    if device.type == "cuda":
        record["memory/cuda_allocated_bytes"] = torch.cuda.memory_allocated(device)
        record["memory/cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        record["memory/cuda_reserved_bytes"] = torch.cuda.memory_reserved(device)
    return record


def lr_metrics(lrs: list[float], group_names: list[str]) -> dict[str, float]:
    """``lr`` is the first group's LR; per-group keys appear when the groups differ."""
    values = [float(lr) for lr in lrs]
    record = {"lr": values[0]} if values else {}
    if len(set(values)) > 1:
        record.update({f"lr/{name}": value for name, value in zip(group_names, values)})
    return record
