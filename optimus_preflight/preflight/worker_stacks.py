"""Stacks of DataLoader worker processes, and shutting hung workers down.

Each worker registers ``faulthandler`` on SIGUSR2 in a wrapped ``worker_init_fn``;
sent SIGUSR2, a worker writes the Python stacks of all its threads to a file, from a C
signal handler, so it works while the worker sits in ``time.sleep``, a lock or a read.
(py-spy would need ptrace rights and an extra binary; /proc only shows native stacks.)
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DUMP_SIGNAL = getattr(signal, "SIGUSR2", None)
_KEEP_OPEN: list[Any] = []


class DumpStacksOnSignal:
    """worker_init_fn wrapper: registers faulthandler, then runs the user's init."""

    def __init__(self, inner: Callable[[int], None] | None, directory: str):
        self.inner = inner
        self.directory = directory

    def __call__(self, worker_id: int) -> None:
        if DUMP_SIGNAL is not None:
            handle = open(os.path.join(self.directory, f"worker-{worker_id}.txt"), "w")
            _KEEP_OPEN.append(handle)  # faulthandler writes to the fd; keep the file alive
            faulthandler.register(DUMP_SIGNAL, file=handle, all_threads=True)
        if self.inner is not None:
            self.inner(worker_id)


def dump_worker_stacks(iterator: Any, directory: str, wait_s: float = 2.0) -> dict[str, str]:
    workers = [w for w in getattr(iterator, "_workers", []) if w.is_alive()]
    if DUMP_SIGNAL is None:
        return {}
    for worker in workers:
        try:
            os.kill(worker.pid, DUMP_SIGNAL)
        except ProcessLookupError:
            pass
    stacks: dict[str, str] = {}
    deadline = time.monotonic() + wait_s
    for index, worker in enumerate(getattr(iterator, "_workers", [])):
        path = Path(directory) / f"worker-{index}.txt"
        text = ""
        while time.monotonic() < deadline:
            text = path.read_text() if path.exists() else ""
            if text.strip():
                time.sleep(0.05)  # let faulthandler finish writing every thread
                text = path.read_text()
                break
            time.sleep(0.02)
        stacks[f"worker {index} (pid {worker.pid})"] = text or "(no stack: the worker did not reach worker_init_fn)"
    return stacks


def stop_workers(iterator: Any, hung: bool, grace_s: float = 1.0) -> None:
    """Shut a DataLoader iterator's workers down now.

    Healthy workers get torch's own shutdown. For hung ones that shutdown would join
    each worker for 5 s before killing it, so they are unregistered from torch's
    SIGCHLD watch first (or their deaths would raise in this process), terminated,
    and then the iterator's shutdown closes its queues and pin-memory thread.
    """
    if not hung:
        if hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        return
    workers = list(getattr(iterator, "_workers", []))
    if getattr(iterator, "_worker_pids_set", False):
        from torch.utils.data import _utils

        _utils.signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False
    if hasattr(iterator, "_workers_done_event"):
        iterator._workers_done_event.set()
    for worker in workers:
        if worker.is_alive():
            worker.terminate()
    deadline = time.monotonic() + grace_s
    for worker in workers:
        worker.join(timeout=max(deadline - time.monotonic(), 0.01))
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=1.0)
    if hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
