"""Fetch the first batches of a DataLoader under a timeout, and explain a hang.

How a hang is bounded, and its stack found, without leaking a thread or a process:
- ``num_workers > 0``: the loading happens in worker processes. The iterator's own
  timeout (the mechanism behind ``DataLoader(timeout=)``) bounds the wait in the main
  process. On timeout each worker dumps its Python stacks through faulthandler (see
  ``worker_stacks.py``), then the workers are terminated and the iterator shut down.
- ``num_workers == 0``: the loading happens in this thread. On the main thread a
  SIGALRM timer raises an exception inside the hanging frame, so its traceback is the
  stack of the hang and nothing is left running. Off the main thread, the fetch runs
  in a daemon thread whose stack is read with ``sys._current_frames()``; that thread
  cannot be stopped, which the report says.
"""

from __future__ import annotations

import contextlib
import linecache
import re
import shutil
import signal
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from optimus_preflight.preflight.worker_stacks import DumpStacksOnSignal, dump_worker_stacks, stop_workers

_TORCH_DIR = str(Path(torch.__file__).parent)
_STDLIB_DIRS = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


class FetchTimeout(BaseException):
    """Raised inside the hanging frame; a BaseException so ``except Exception`` in
    dataset code cannot swallow it."""


@dataclass
class FetchResult:
    batches: list[Any] = field(default_factory=list)
    latency_s: float | None = None  # to the first batch
    elapsed_s: float = 0.0
    timed_out: bool = False
    error: BaseException | None = None
    error_text: str | None = None
    stacks: dict[str, str] = field(default_factory=dict)  # "main", "worker 0 (pid 123)"
    hang_frame: str | None = None  # 'File "x.py", line 12, in __getitem__: time.sleep(...)'
    # Frames of the hanging thread, innermost first: 'File "x.py", line 12, in __getitem__'.
    hang_stack: list[str] = field(default_factory=list)
    leaked_thread: bool = False


def _is_library_file(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR) or filename.startswith(_STDLIB_DIRS) or filename == __file__


def _frame_text(filename: str, lineno: int, name: str) -> str:
    code = linecache.getline(filename, lineno).strip()
    return f'File "{filename}", line {lineno}, in {name}' + (f": {code}" if code else "")


_FAULTHANDLER_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)')


def hang_from_faulthandler(dump: str) -> tuple[str | None, list[str]]:
    """(innermost frame outside torch and the standard library, its thread's frames).

    faulthandler writes one block per thread, most recent call first.
    """
    blocks = [block for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip()) if block.strip()]
    parsed = [list(_FAULTHANDLER_FRAME.finditer(block)) for block in blocks]
    for frames in parsed:
        for match in frames:
            if not _is_library_file(match["file"]):
                stack = [f'File "{m["file"]}", line {m["line"]}, in {m["name"]}' for m in frames]
                return _frame_text(match["file"], int(match["line"]), match["name"]), stack
    frames = next((frames for frames in parsed if frames), [])
    if not frames:
        return None, []
    first = frames[0]
    stack = [f'File "{m["file"]}", line {m["line"]}, in {m["name"]}' for m in frames]
    return _frame_text(first["file"], int(first["line"]), first["name"]), stack


def _innermost_first(stack: traceback.StackSummary) -> list[str]:
    return [f'File "{f.filename}", line {f.lineno}, in {f.name}' for f in reversed(stack) if f.filename != __file__]


def hang_frame_from_stack(stack: traceback.StackSummary) -> str | None:
    """The innermost user frame of a stack (oldest call first)."""
    frames = [f for f in stack if f.filename != __file__]
    for frame in reversed(frames):
        if not _is_library_file(frame.filename):
            return _frame_text(frame.filename, frame.lineno, frame.name)
    return _frame_text(frames[-1].filename, frames[-1].lineno, frames[-1].name) if frames else None


def _thread_stacks() -> dict[str, str]:
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return {
        f"main process, thread {names.get(ident, ident)}": "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
    }


def fetch_batches(loader: Any, count: int = 1, timeout_s: float = 300.0) -> FetchResult:
    """Fetch up to ``count`` batches, each within ``timeout_s``; never raises for data errors."""
    if getattr(loader, "num_workers", 0) > 0:
        return _fetch_with_workers(loader, count, timeout_s)
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM"):
        return _fetch_with_alarm(loader, count, timeout_s)
    return _fetch_in_thread(loader, count, timeout_s)


def _collect(iterator: Any, count: int, result: FetchResult, started: float) -> None:
    for _ in range(count):
        try:
            batch = next(iterator)
        except StopIteration:
            break
        if result.latency_s is None:
            result.latency_s = time.perf_counter() - started
        result.batches.append(batch)


def _record_error(result: FetchResult, error: BaseException) -> None:
    result.error = error
    result.error_text = "".join(traceback.format_exception_only(type(error), error)).strip()


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise FetchTimeout in this (main) thread after ``seconds``; restores any outer
    timer (e.g. pytest-timeout's). A no-op off the main thread or without SIGALRM."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def on_alarm(signum, frame):
        raise FetchTimeout()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    outer = signal.getitimer(signal.ITIMER_REAL)
    started = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer[0] - (time.perf_counter() - started), 0.001), outer[1])


def _record_main_hang(result: FetchResult, error: FetchTimeout) -> None:
    result.timed_out = True
    stack = traceback.StackSummary.from_list(traceback.extract_tb(error.__traceback__)[:-1])  # drop on_alarm
    result.stacks["main process"] = "".join(stack.format())
    result.hang_stack = _innermost_first(stack)
    result.hang_frame = hang_frame_from_stack(stack)


def _fetch_with_alarm(loader: Any, count: int, timeout_s: float) -> FetchResult:
    result = FetchResult()
    started = time.perf_counter()
    try:
        iterator = iter(loader)
        for _ in range(count):  # one budget per batch, as DataLoader's own timeout
            before = len(result.batches)
            with _alarm(timeout_s):
                _collect(iterator, 1, result, started)
            if len(result.batches) == before:
                break
    except FetchTimeout as error:
        _record_main_hang(result, error)
    except Exception as error:  # a broken dataset or collate: reported, not raised
        _record_error(result, error)
    result.elapsed_s = time.perf_counter() - started
    return result


def _fetch_in_thread(loader: Any, count: int, timeout_s: float) -> FetchResult:
    result = FetchResult()
    started = time.perf_counter()

    def target() -> None:
        try:
            _collect(iter(loader), count, result, started)
        except Exception as error:
            _record_error(result, error)

    thread = threading.Thread(target=target, name="preflight-fetch", daemon=True)
    thread.start()
    thread.join(timeout_s * count)
    if thread.is_alive():
        frame = sys._current_frames().get(thread.ident)
        stack = traceback.extract_stack(frame) if frame is not None else traceback.StackSummary()
        result.timed_out = True
        result.leaked_thread = True
        result.stacks["main process, fetch thread"] = "".join(stack.format())
        result.hang_stack = _innermost_first(stack)
        result.hang_frame = hang_frame_from_stack(stack)
    result.elapsed_s = time.perf_counter() - started
    return result


def _fetch_with_workers(loader: Any, count: int, timeout_s: float) -> FetchResult:
    result = FetchResult()
    directory = tempfile.mkdtemp(prefix="preflight-stacks-")
    original_init = loader.worker_init_fn
    started = time.perf_counter()
    iterator = None
    try:
        # Workers are bounded by the iterator's timeout; the alarm is a backstop for a
        # hang in this process (a sampler, a batch sampler, a pin-memory copy).
        with _alarm(timeout_s * count + 5.0):
            loader.worker_init_fn = DumpStacksOnSignal(original_init, directory)
            try:
                # Our own iterator even with persistent_workers: it is shut down here,
                # and the one training creates later starts fresh.
                iterator = loader._get_iterator() if hasattr(loader, "_get_iterator") else iter(loader)
            finally:
                loader.worker_init_fn = original_init
            iterator._timeout = timeout_s
            _collect(iterator, count, result, started)
    except FetchTimeout as error:
        _record_main_hang(result, error)
    except RuntimeError as error:
        if str(error).startswith("DataLoader timed out after") and iterator is not None:
            result.timed_out = True
            result.stacks.update(dump_worker_stacks(iterator, directory))
            result.stacks.update(_thread_stacks())
            for name, text in result.stacks.items():
                if name.startswith("worker") and result.hang_frame is None:
                    result.hang_frame, result.hang_stack = hang_from_faulthandler(text)
                    result.hang_stack = [f"in {name}:"] + result.hang_stack if result.hang_stack else []
        else:
            _record_error(result, error)
    except Exception as error:
        _record_error(result, error)
    finally:
        if iterator is not None:
            stop_workers(iterator, hung=result.timed_out)
        shutil.rmtree(directory, ignore_errors=True)
        result.elapsed_s = time.perf_counter() - started
    return result


