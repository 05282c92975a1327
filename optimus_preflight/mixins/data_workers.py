"""The training loader's workers, for the data watchdog and a stop: where a stalled
fetch blocks, and ending workers that do not answer.

Both reuse the preflight's worker-stack helpers (preflight/data_access/worker_stacks.py):
workers started for training register ``faulthandler`` (``DumpStacksOnSignal``) so that,
on a stall, each writes its Python stacks; the frame named is the innermost one of the
user's code, as the preflight names a hang before training.
"""

from __future__ import annotations

import contextlib
import os
import signal
import traceback
from pathlib import Path
from typing import Any, Iterator

import psutil

import optimus_preflight
from optimus_preflight.checkpoint.fetch_watchdog import Stall
from optimus_preflight.preflight.data_access.worker_stacks import (
    DUMP_SIGNAL,
    DumpStacksOnSignal,
    StacksDirectory,
    dump_worker_stacks,
    hang_frame_from_stack,
    hang_from_faulthandler,
    innermost_first,
    stop_workers,
)
from optimus_preflight.training.error_context import name_failing_samples

_PACKAGE = str(Path(optimus_preflight.__file__).parent)
_RECIPES = str(Path(optimus_preflight.__file__).parent / "recipes")
# A stop ends workers that do not take the shutdown message within this (then SIGKILL).
WORKER_GRACE_S = 1.0


class TrainingWorkerInit(DumpStacksOnSignal):
    """worker_init_fn of the training loader's workers: stacks on SIGUSR2 (for the
    watchdog), a failing sample named on its error, then the loader's own init."""

    def __call__(self, worker_id: int) -> None:
        name_failing_samples()
        super().__call__(worker_id)


def open_watched(loader: Any, stacks: StacksDirectory) -> Iterator[Any]:
    """``iter(loader)``, its new workers registered to dump their stacks into ``stacks``."""
    if DUMP_SIGNAL is None or not getattr(loader, "num_workers", 0) or not hasattr(loader, "worker_init_fn"):
        return iter(loader)
    original = loader.worker_init_fn
    loader.worker_init_fn = TrainingWorkerInit(original, stacks.path)
    try:
        return iter(loader)
    finally:
        loader.worker_init_fn = original


def _workers(iterator: Any) -> list[Any]:
    return list(getattr(iterator, "_workers", None) or [])


def _dumps_stacks(iterator: Any, stacks_dir: str) -> bool:
    """Were this iterator's workers started by ``open_watched`` (else SIGUSR2 would end them)?"""
    init = getattr(iterator, "_worker_init_fn", None)
    return isinstance(init, TrainingWorkerInit) and init.directory == stacks_dir


def _owing_worker(iterator: Any) -> int | None:
    """The worker the main process waits on: torch hands batches out in order, and the
    next one (``_rcvd_idx``) is still outstanding at that worker."""
    task = (getattr(iterator, "_task_info", None) or {}).get(getattr(iterator, "_rcvd_idx", None))
    return task[0] if task is not None and len(task) == 1 else None


def _is_stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def _user_frames(stack: traceback.StackSummary) -> traceback.StackSummary:
    """The stack without this package's own frames (its recipes are user code)."""
    kept = [f for f in stack if not f.filename.startswith(_PACKAGE) or f.filename.startswith(_RECIPES)]
    return traceback.StackSummary.from_list(kept)


def describe_stall(iterator: Any, main_stack: traceback.StackSummary, stacks_dir: str, timeout_s: float) -> Stall:
    """Where a wait for a training batch blocks: in a worker (the one that owes the batch,
    by its stack), or in the main process (its main thread's stack)."""
    workers = _workers(iterator)
    if not workers:
        stack = _user_frames(main_stack)
        return Stall(timeout_s, "the main process", hang_frame_from_stack(stack), innermost_first(stack))
    owing = _owing_worker(iterator)
    order = [owing] if owing is not None and owing < len(workers) else []
    order += [index for index in range(len(workers)) if index not in order]
    for index in order:
        worker = workers[index]
        if worker.is_alive() and _is_stopped(worker.pid):
            return Stall(timeout_s, f"DataLoader worker {index} (pid {worker.pid})",
                         state=f"is stopped (SIGSTOP or SIGTSTP; `kill -CONT {worker.pid}` resumes it)")
    if not _dumps_stacks(iterator, stacks_dir):
        where = f"DataLoader worker {owing}" if owing is not None else "the DataLoader's workers"
        return Stall(timeout_s, where, state="blocks (no stack: its workers were started before the watchdog)")
    stacks = dump_worker_stacks(iterator, stacks_dir)
    names = list(stacks)
    best = Stall(timeout_s, "the DataLoader's workers")
    for index in order:
        if index >= len(names):
            continue
        frame, stack, is_user = hang_from_faulthandler(stacks[names[index]])
        if frame is not None and (best.frame is None or is_user):
            best = Stall(timeout_s, f"DataLoader {names[index]}", frame, stack)
        if is_user:
            break
    return best


def release_workers(iterator: Any, *, hung: bool, grace_s: float = WORKER_GRACE_S) -> None:
    """End the iterator's workers now, whatever they are doing, so the interpreter's exit
    (multiprocessing joins its children at exit) does not wait on one: a stopped worker
    is continued (so SIGTERM reaches it), the rest asked to exit; whoever still runs
    after ``grace_s`` is terminated, then killed (``stop_workers``)."""
    workers = _workers(iterator)
    if not workers:
        return
    for worker in workers:
        if worker.is_alive() and worker.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGCONT)
    stop_workers(iterator, hung=hung, grace_s=grace_s)
