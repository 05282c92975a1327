"""The user data code a check calls, under the preflight's timeout, and what a hang means.

A check that reads data (a sample, ``len(dataset)``, the loader's batches) does it
through a ``DataGuard``. A call that hangs is reported on that check as DATA_TIMEOUT,
naming the frame that blocks, and recorded in ``ctx.artifacts.data_hang``: every later
guarded call skips its check at once ("the data code hung in data.collate"), so one
hang costs the preflight one timeout, not one per check.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from omegaconf import OmegaConf

from optimus_preflight.preflight.data_access.fetch import (
    DataHang,
    FetchResult,
    GuardedBatches,
    Hang,
    bounded_call,
    fetch_batches,
)
from optimus_preflight.preflight.framework import Findings, SkipCheck, StopCheck
from optimus_preflight.preflight.framework.issues import DATA_TIMEOUT

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class HungEarlier:
    check: str
    hang: Hang


def preflight_timeout(ctx: PreflightContext) -> float:
    return float(OmegaConf.select(ctx.cfg, "preflight.first_batch_timeout_s", default=DEFAULT_TIMEOUT_S))


def _stack_excerpt(frames: list[str], limit: int = 8) -> str:
    """The hanging thread's innermost frames, where the hang is."""
    shown = frames[:limit] + (["..."] if len(frames) > limit else [])
    return "\n".join("    " + line for line in shown)


@dataclass(frozen=True)
class HangReport:
    message: str
    fix: str
    config_key: str
    code_fix: str | None  # for a recipe whose own build_dataloaders() ignores data.*


def describe_hang(hang: Hang, workers: int) -> HangReport:
    """Where it hangs, and a fix that works for a loader with ``workers`` workers."""
    leaked = " (the thread could not be stopped)" if hang.leaked_thread else ""
    where = f" Hung in {hang.where}{leaked}" + (f" at {hang.frame}." if hang.frame else ".")
    stack = f"\n  Stack, innermost call first:\n{_stack_excerpt(hang.stack)}" if hang.stack else ""
    message = f"{hang.headline} (num_workers={workers}).{where}{stack}"
    look = ("Fix the code at the frame named above: check that dataset paths and network mounts respond and that "
            "nothing it waits on (a lock, a queue, a socket) is held elsewhere")
    slow = "if the data is legitimately this slow, raise preflight.first_batch_timeout_s."
    if hang.in_worker_init:  # num_workers=0 would only skip it
        return HangReport(message, "The DataLoader's worker_init_fn does not return: fix it at the frame named above "
                          "(it runs once in each worker before any sample is read); if it is legitimately slow, raise "
                          "preflight.first_batch_timeout_s.", "preflight.first_batch_timeout_s", None)
    if workers == 0:  # already in one process: num_workers=0 is no news
        return HangReport(message, f"{look}; {slow}", "preflight.first_batch_timeout_s", None)
    return HangReport(
        message,
        f"Run once with data.num_workers=0 to debug in one process. {look}; try fewer workers; {slow}",
        "data.num_workers",
        f"Pass num_workers=0 to the DataLoader your build_dataloaders() returns to debug in one process. "
        f"{look}; try fewer workers; {slow}",
    )


class DataGuard:
    """The user data code one check calls, each call within ``preflight.first_batch_timeout_s``."""

    def __init__(self, ctx: PreflightContext, check: str, findings: Findings):
        self.ctx = ctx
        self.check = check
        self.findings = findings
        self.timeout_s = preflight_timeout(ctx)

    def skip_if_hung(self) -> None:
        earlier = self.ctx.artifacts.data_hang
        if earlier is not None:
            at = f" at {earlier.hang.frame}" if earlier.hang.frame else ""
            raise SkipCheck(f"not run: the data code hung in {earlier.check} ({earlier.hang.headline}{at}), "
                            "so it is not called again")

    def call(self, fn: Callable[..., T], *args: Any, what: str) -> T:
        """``fn(*args)``; a hang ends the check with DATA_TIMEOUT."""
        self.skip_if_hung()
        try:
            return bounded_call(lambda: fn(*args), self.timeout_s, what)
        except DataHang as hung:
            self.fail(hung.hang)

    @contextlib.contextmanager
    def batches(self, loader: Any, purpose: str = "") -> Iterator[GuardedBatches]:
        """The loader's batches, each within the timeout; workers stopped on exit."""
        self.skip_if_hung()
        try:
            with GuardedBatches(loader, self.timeout_s, purpose) as batches:
                yield batches
        except DataHang as hung:
            self.fail(hung.hang)

    def fail(self, hang: Hang) -> NoReturn:
        """Report the hang on this check, remember it for the later ones, end the check."""
        self.ctx.artifacts.data_hang = HungEarlier(self.check, hang)
        self.findings.data["stacks"] = hang.stacks
        report = describe_hang(hang, getattr(self.ctx.train_loader, "num_workers", 0))
        self.findings.error(DATA_TIMEOUT, report.message, report.fix, report.config_key, code_fix=report.code_fix)
        raise StopCheck(hang.headline)


def fetch_first_batch(loader: Any, timeout_s: float, rank: int | None = None) -> FetchResult:
    """The loader's first batch within ``timeout_s``, for callers outside a check (the
    result holds it and its latency): RuntimeError naming the hang and the fix, or the
    error, never a wait without end."""
    result = fetch_batches(loader, 1, timeout_s)
    workers = getattr(loader, "num_workers", 0)
    who = f"rank {rank}: " if rank is not None else ""
    if result.hang is not None:
        report = describe_hang(result.hang, workers)
        raise RuntimeError(f"{who}{report.message}\nFix: {report.fix}")
    if result.error is not None:
        fix = ("run with data.num_workers=0 for the full traceback, and fix the dataset or collate_fn" if workers
               else "fix the dataset or collate_fn where the traceback above points")
        raise RuntimeError(f"{who}fetching the first batch raised {result.error_text}\nFix: {fix}.") from result.error
    if not result.batches:
        raise RuntimeError(f"{who}the DataLoader yields no batches. Fix: check the dataset is not empty.")
    return result


def read_samples(ctx: Any, check: str, findings: Any, loader: Any, purpose: str, convert: Any, limit: int,
                 budget_s: float) -> list[Any] | None:
    """``convert(batch)`` of the loader's batches, guarded, until the parts hold ``limit`` samples
    (``len`` of a part, or of its first element when it is a tuple) or ``budget_s`` has passed;
    None as soon as a batch converts to None (a batch of another shape). The loader's state
    (sampler, generator, workers) is put back after."""
    from optimus_preflight.preflight.framework.preserve import preserved_data_state

    def size(part: Any) -> int:
        return len(part[0]) if isinstance(part, tuple) else len(part)

    parts: list[Any] = []
    started = time.perf_counter()
    with preserved_data_state(ctx), DataGuard(ctx, check, findings).batches(loader, purpose) as stream:
        for batch in stream:
            part = convert(batch)
            if part is None:
                return None
            parts.append(part)
            if sum(size(p) for p in parts) >= limit or time.perf_counter() - started > budget_s:
                break
    return parts
