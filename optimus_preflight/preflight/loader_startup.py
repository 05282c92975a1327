"""The first-batch startup check of a DataLoader, and the host RAM its settings imply.

Typed: the caller passes the loader, the settings to multiply by (``LoaderSettings``,
with the config keys that set them so messages name the user's own keys) and, when it
has one, an estimate made from its config. Reading a config into these is the caller's
business: the core knows its own config only, and not every loader comes from one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import psutil

from optimus_preflight.config.lenient import as_int
from optimus_preflight.preflight.analyses.sizes import dataloader_host_bytes
from optimus_preflight.preflight.checks.data_checks import RAM_ERROR_FRACTION, RAM_WARN_FRACTION
from optimus_preflight.preflight.data_access.fetch import fetch_batches
from optimus_preflight.preflight.data_access.guard import describe_hang
from optimus_preflight.preflight.data_access.samples import batch_nbytes

log = logging.getLogger("optimus_preflight")
GIB = 1024**3


@dataclass(frozen=True)
class LoaderSettings:
    """The DataLoader settings a memory estimate multiplies by, and the config keys that
    set them, so messages name the user's own keys. A key left None is named as the
    DataLoader's argument; ``pin_key=None`` means there is no pin setting to suggest."""

    batch_size: int | None = None
    num_workers: int = 0
    prefetch_factor: int | None = None  # None: torch's default (2) when there are workers
    pin_memory: bool = False
    workers_key: str | None = None
    prefetch_key: str | None = None
    batch_key: str | None = None
    pin_key: str | None = "the DataLoader's pin_memory"

    def names(self) -> tuple[str, str, str]:
        """The workers, prefetch and batch settings as a message names them."""
        return (self.workers_key or "the DataLoader's num_workers", self.prefetch_key or
                "the DataLoader's prefetch_factor", self.batch_key or "the DataLoader's batch_size")

    def describe(self) -> str:
        workers, prefetch_name, batch_name = self.names()
        prefetch = self.prefetch_factor if self.prefetch_factor is not None else "default"
        batch = self.batch_size if self.batch_size is not None else "?"
        return f"{workers}={self.num_workers}, {prefetch_name}={prefetch}, {batch_name}={batch}"

    def fix(self) -> str:
        workers, prefetch, batch = self.names()
        pin = f", or set {self.pin_key}=false" if self.pin_key and self.pin_memory else ""
        return f"lower {workers}, {prefetch} or {batch}{pin}"


def with_loader_settings(settings: LoaderSettings | None, loader: Any) -> LoaderSettings:
    """The settings the loader object really has override the config's: it is the
    DataLoader that will run, whatever a config says (a recipe may build its own)."""
    base = settings or LoaderSettings()
    if loader is None:
        return base
    workers = as_int(getattr(loader, "num_workers", None))
    prefetch = as_int(getattr(loader, "prefetch_factor", None), minimum=1)
    pin = getattr(loader, "pin_memory", None)
    batch = as_int(getattr(loader, "batch_size", None), minimum=1)
    has_workers = workers is not None
    return replace(
        base,
        batch_size=batch if batch is not None else base.batch_size,
        num_workers=workers if has_workers else base.num_workers,
        # A DataLoader without workers reports prefetch_factor=None: that is its truth too.
        prefetch_factor=prefetch if prefetch is not None or has_workers else base.prefetch_factor,
        pin_memory=pin if isinstance(pin, bool) else base.pin_memory,
    )


def loader_host_bytes(batch_bytes: int, settings: LoaderSettings) -> dict[str, int]:
    """Host RAM the loader holds for batches of ``batch_bytes``: in flight, plus pinned copies."""
    return dataloader_host_bytes(batch_bytes, settings.num_workers, settings.prefetch_factor, settings.pin_memory)


def available_ram_bytes() -> int:
    return int(psutil.virtual_memory().available)


def _hang_error(hang: Any, settings: LoaderSettings, rank: int, estimate_bytes: int, available: int) -> RuntimeError:
    report = describe_hang(hang, settings.num_workers)
    fix = report.fix.replace("data.num_workers", settings.workers_key) if settings.workers_key else report.fix
    lines = [f"rank {rank}: {report.message}", f"Fix: {fix}", f"Loader settings: {settings.describe()}."]
    if estimate_bytes > 0 and available > 0:
        lines.append(f"Estimated DataLoader RAM from the config: {estimate_bytes / GIB:.1f} GiB "
                     f"({100 * estimate_bytes / available:.0f}% of {available / GIB:.1f} GiB "
                     f"available); if it is high, {settings.fix()}.")
    return RuntimeError("\n".join(lines))


def check_first_batch(loader: Any, settings: LoaderSettings, *, rank: int = 0, timeout_s: float = 300.0,
                      config_estimate_bytes: int = 0) -> None:
    """Fetch the first batch of ``loader`` within ``timeout_s`` and check the host RAM it implies.

    - a hang raises RuntimeError naming the frame that blocks (in this process or in a
      worker, whose stacks are dumped) and the fix, with the settings and
      ``config_estimate_bytes`` (an estimate made from a config; 0: none);
    - an exception of the loader (its ``__iter__``, a ``__getitem__``, a collate_fn;
      from a worker, as DataLoader re-raises it) propagates as itself after an ERROR log
      with the fix: callers catch the dataset's own exception types;
    - a loader that yields nothing raises RuntimeError;
    - the measured first batch times the batches in flight: a warning above
      ``RAM_WARN_FRACTION`` of the available host RAM, RuntimeError above
      ``RAM_ERROR_FRACTION``. Only rank 0 logs the success line and the warning.
    """
    available = available_ram_bytes()
    result = fetch_batches(loader, 1, timeout_s)  # iter(loader) included: a blocking __iter__ is a hang too
    if result.hang is not None:
        raise _hang_error(result.hang, settings, rank, config_estimate_bytes, available)
    if result.error is not None:
        fix = ("run with num_workers=0 for the traceback in one process, and fix the dataset or collate_fn"
               if settings.num_workers else "fix the dataset or collate_fn where the traceback points")
        log.error("rank %d: fetching the first batch raised %s. Fix: %s.", rank, result.error_text, fix)
        raise result.error
    if not result.batches:
        raise RuntimeError(f"rank {rank}: the DataLoader yields no batches. Fix: check the dataset is not empty.")
    held = loader_host_bytes(batch_nbytes(result.batches[0]), settings)["total_bytes"]
    fraction = held / max(available, 1)
    if rank == 0:
        log.info("first batch in %.2f s; the DataLoader holds ~%.3f GiB (%.1f%% of available RAM; %s)",
                 result.latency_s or 0.0, held / GIB, 100 * fraction, settings.describe())
    if fraction > RAM_ERROR_FRACTION:
        raise RuntimeError(f"rank {rank}: the DataLoader would hold {held / GIB:.1f} GiB, "
                           f"{100 * fraction:.0f}% of the {available / GIB:.1f} GiB of available host RAM "
                           f"({settings.describe()}). Fix: {settings.fix()}.")
    if fraction > RAM_WARN_FRACTION and rank == 0:
        log.warning("the DataLoader would hold %.0f%% of the available host RAM (%s); %s",
                    100 * fraction, settings.describe(), settings.fix())
