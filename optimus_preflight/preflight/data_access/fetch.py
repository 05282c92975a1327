"""Call user data code under a timeout, and name the frame it hangs in.

Everything the preflight asks of the user's data (a dataset's ``__len__``, a sample, a
loader's ``iter()`` and each ``next()``) goes through ``bounded_call`` or
``GuardedBatches``; a call that does not return in time raises ``DataHang``. How a
hang is bounded, and its stack found, without leaking a thread or a process:
- In this process, on the main thread: a SIGALRM timer raises ``FetchTimeout`` inside
  the hanging frame, so its traceback is the stack of the hang and nothing is left
  running. Off the main thread the call runs in a daemon thread whose stack is read
  with ``sys._current_frames()``; that thread cannot be stopped, which the report says.
- In DataLoader workers (``num_workers > 0``): the iterator's own timeout (the
  mechanism behind ``DataLoader(timeout=)``) bounds the wait. On timeout each worker
  dumps its Python stacks through faulthandler (``worker_stacks.py``), then the workers
  are terminated. The alarm stays on, a little longer, as the backstop for a hang in
  this process (a sampler, a pin-memory copy).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from optimus_preflight.preflight.data_access.worker_stacks import (
    DumpStacksOnSignal,
    StacksDirectory,
    dump_worker_stacks,
    hang_frame_from_stack,
    hang_from_faulthandler,
    innermost_first,
    stop_workers,
)

T = TypeVar("T")
# Extra time the in-process backstop gives a worker-based next() over the iterator's
# own timeout, so that a worker hang is seen by the path that can dump its stack.
BACKSTOP_S = 2.0
_END = object()
WORKER_TIMEOUT_PREFIX = "DataLoader timed out after"


class FetchTimeout(BaseException):
    """Raised inside the hanging frame; a BaseException so ``except Exception`` in
    dataset code cannot swallow it."""


@dataclass
class Hang:
    """Where data code blocked: enough to name it in a report."""

    what: str  # "the first batch", "dataset[63]", "iter(loader)"
    timeout_s: float
    where: str = "the main process"  # or "worker 0 (pid 123)", "a fetch thread of the main process"
    frame: str | None = None  # 'File "x.py", line 12, in __getitem__: time.sleep(3600)'
    stack: list[str] = field(default_factory=list)  # the hanging thread's frames, innermost first
    stacks: dict[str, str] = field(default_factory=dict)  # every stack seen: "main process", "worker 0 (pid 123)"
    leaked_thread: bool = False  # a daemon thread still sits in the hang
    in_worker_init: bool = False  # a worker hangs in worker_init_fn, before it reads any data

    @property
    def headline(self) -> str:
        verb = "arrive" if "batch" in self.what else "return"
        return f"{self.what} did not {verb} within {self.timeout_s:g} s"


class DataHang(Exception):
    def __init__(self, hang: Hang):
        super().__init__(hang.headline + (f" at {hang.frame}" if hang.frame else ""))
        self.hang = hang


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise FetchTimeout in this (main) thread after ``seconds``; restores any outer
    timer (e.g. pytest-timeout's)."""
    armed = True

    def on_alarm(signum, frame):
        if armed:  # not once the call has returned
            raise FetchTimeout()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    outer = signal.getitimer(signal.ITIMER_REAL)
    started = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer[0] - (time.perf_counter() - started), 0.001), outer[1])


def _can_alarm() -> bool:
    return threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM")


def bounded_call(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """``fn()`` if it returns within ``timeout_s``; its exceptions pass through. Else
    DataHang, naming the frame it hangs in."""
    if not _can_alarm():
        return _call_in_thread(fn, timeout_s, what)
    try:
        with _alarm(timeout_s):
            return fn()
    except FetchTimeout as error:
        stack = traceback.StackSummary.from_list(traceback.extract_tb(error.__traceback__)[:-1])  # drop on_alarm
        raise DataHang(Hang(what, timeout_s, frame=hang_frame_from_stack(stack), stack=innermost_first(stack),
                            stacks={"main process": "".join(stack.format())})) from None


def _call_in_thread(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as error:  # handed to the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=target, name="preflight-fetch", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        frame = sys._current_frames().get(thread.ident)
        stack = traceback.extract_stack(frame) if frame is not None else traceback.StackSummary()
        raise DataHang(Hang(what, timeout_s, where="a fetch thread of the main process",
                            frame=hang_frame_from_stack(stack), stack=innermost_first(stack),
                            stacks={"main process, fetch thread": "".join(stack.format())}, leaked_thread=True))
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _thread_stacks() -> dict[str, str]:
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return {
        f"main process, thread {names.get(ident, ident)}": "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
    }


def _iterator_in_traceback(tb: Any) -> Any:
    """The DataLoader iterator whose __init__ an exception interrupted (its workers
    are already running and must be stopped), if any."""
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if hasattr(candidate, "_workers") and hasattr(candidate, "_shutdown_workers"):
            return candidate
        tb = tb.tb_next
    return None


class GuardedBatches:
    """A loader's batches with ``iter()`` and every ``next()`` bounded by ``timeout_s``
    (one budget per batch, as DataLoader's own timeout); a hang raises DataHang. Use it
    as a context manager: on exit the workers it started are stopped, at once if it
    did not end normally. Its own iterator even with persistent_workers: the one
    training creates later starts fresh."""

    def __init__(self, loader: Any, timeout_s: float, purpose: str = ""):
        self.loader = loader
        self.timeout_s = timeout_s
        self.purpose = purpose  # "the throughput burst": batch 3 of the throughput burst
        # Worker stacks and the iterator's own timeout need a torch DataLoader; any other
        # loader object is bounded in this process like a single-process one.
        self.with_workers = getattr(loader, "num_workers", 0) > 0 and hasattr(loader, "_get_iterator")
        self.count = 0
        self._iterator: Any = None
        self._stacks = StacksDirectory("preflight-stacks-")

    def _name(self, index: int) -> str:
        if self.purpose:
            return f"batch {index} of {self.purpose}"
        return "the first batch" if index == 1 else f"batch {index}"

    def __enter__(self) -> GuardedBatches:
        try:
            if self.with_workers:
                self._iterator = bounded_call(self._start_workers, self.timeout_s + BACKSTOP_S, "iter(loader)")
            else:  # an IterableDataset's __iter__, a sampler: user code, in this process
                self._iterator = bounded_call(lambda: iter(self.loader), self.timeout_s, "iter(loader)")
        except BaseException:
            self.close(hung=True)
            raise
        return self

    def _start_workers(self) -> Any:
        original_init = self.loader.worker_init_fn
        self.loader.worker_init_fn = DumpStacksOnSignal(original_init, self._stacks.path)
        try:
            iterator = self.loader._get_iterator()
        except BaseException as error:  # e.g. a sampler hung while the iterator primed its workers
            started = _iterator_in_traceback(error.__traceback__)
            if started is not None:
                stop_workers(started, hung=True)
            raise
        finally:
            self.loader.worker_init_fn = original_init
        if hasattr(iterator, "_timeout"):
            iterator._timeout = self.timeout_s
        return iterator

    def __iter__(self) -> GuardedBatches:
        return self

    def __next__(self) -> Any:
        self.count += 1
        what = self._name(self.count)
        budget = self.timeout_s + (BACKSTOP_S if self.with_workers else 0.0)
        try:
            batch = bounded_call(lambda: next(self._iterator, _END), budget, what)
        except RuntimeError as error:
            if self.with_workers and str(error).startswith(WORKER_TIMEOUT_PREFIX):
                raise DataHang(self._worker_hang(what)) from None
            raise
        if batch is _END:
            raise StopIteration
        return batch

    def _worker_hang(self, what: str) -> Hang:
        hang = Hang(what, self.timeout_s, where="the DataLoader's workers")
        hang.stacks.update(dump_worker_stacks(self._iterator, self._stacks.created or ""))
        hang.stacks.update(_thread_stacks())
        for name, text in hang.stacks.items():
            if not name.startswith("worker"):
                continue
            frame, stack, is_user = hang_from_faulthandler(text)
            if frame is not None and (hang.frame is None or is_user):
                hang.where, hang.frame, hang.stack = name, frame, [f"in {name}:", *stack]
                # DumpStacksOnSignal.__call__ runs the user's worker_init_fn.
                hang.in_worker_init = any("worker_stacks.py" in line and line.endswith("in __call__") for line in stack)
            if is_user:
                break
        return hang

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(hung=exc_type is not None)

    def close(self, hung: bool = False) -> None:
        if self._iterator is not None and self.with_workers:
            stop_workers(self._iterator, hung=hung)
        self._iterator = None
        self._stacks.remove()


@dataclass
class FetchResult:
    batches: list[Any] = field(default_factory=list)
    latency_s: float | None = None  # to the first batch
    elapsed_s: float = 0.0
    hang: Hang | None = None
    error: BaseException | None = None
    error_text: str | None = None  # the exception's type and message
    error_trace: str | None = None  # and its traceback


def fetch_batches(loader: Any, count: int = 1, timeout_s: float = 300.0) -> FetchResult:
    """Fetch up to ``count`` batches, each within ``timeout_s``; never raises for data errors."""
    result = FetchResult()
    started = time.perf_counter()
    try:
        with GuardedBatches(loader, timeout_s) as batches:
            for batch in batches:
                if result.latency_s is None:
                    result.latency_s = time.perf_counter() - started
                result.batches.append(batch)
                if len(result.batches) == count:
                    break
    except DataHang as hung:
        result.hang = hung.hang
    except Exception as error:  # a broken dataset or collate: reported, not raised
        result.error = error
        result.error_text = "".join(traceback.format_exception_only(type(error), error)).strip()
        result.error_trace = "".join(traceback.format_exception(type(error), error, error.__traceback__)).strip()
    result.elapsed_s = time.perf_counter() - started
    return result
