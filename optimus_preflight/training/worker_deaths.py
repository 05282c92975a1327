"""DataLoader workers that die mid-run: the kernel's OOM killer, a full /dev/shm, a
crash in native decoding code.

torch learns of a dead worker from SIGCHLD and raises from its signal handler,
wherever the main thread happens to be: in a backward pass, or halfway through
``optimizer.step`` with some parameters updated and others not. A checkpoint taken
after that would hold a state no step boundary ever had. ``WorkerDeathGuard`` defers
the error to the next data fetch, where the training state is still at the last step
boundary, and turns it into ``WorkerDied``: a message that says what happened and
what to try, and a checkpoint the run can resume from.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any

from torch.utils.data import _utils as data_utils

from optimus_preflight.errors import UserError

_DEATH = re.compile(r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]+)\) (?:is killed by signal: ([^.\n]+)|exited unexpectedly)")

# What a worker's death by each signal most likely means, and what to try.
_CAUSES = {
    "Killed": ("was killed (SIGKILL), most likely by the kernel's out-of-memory killer: host RAM ran out "
               "(`dmesg | grep -i oom` confirms it)", "fewer workers, a smaller prefetch_factor or batch size"),
    "Bus error": ("died of a bus error: /dev/shm, through which workers hand batches over, is full",
                  "a larger /dev/shm (docker --shm-size=8g) or fewer workers"),
    "Segmentation fault": ("crashed (segmentation fault) in native code: an image/audio decoder or a library "
                           "that is not fork-safe", "num_workers=0 to see the crash in the main process"),
}
# torch says only "exited unexpectedly" when its status check, not its SIGCHLD handler,
# finds the worker gone (which one wins is a race): the cause is then unknown, and the
# OOM killer is the most common one.
_EXITED = ("exited unexpectedly; torch does not say why: most often the kernel's out-of-memory killer "
           "(host RAM ran out; `dmesg | grep -i oom` confirms it), else a crash in native code",
           "fewer workers, a smaller prefetch_factor or batch size; num_workers=0 shows a crash in the main process")


class WorkerDied(UserError):
    """A DataLoader worker of the training or validation loader died."""


def worker_death(error: BaseException) -> WorkerDied | None:
    """The WorkerDied an error from torch's DataLoader means, or None if it is not one."""
    match = _DEATH.search(str(error)) if isinstance(error, RuntimeError) else None
    if match is None:
        return None
    pids, signal_name = match.group(1).strip(), (match.group(2) or "").strip()
    what, remedy = _CAUSES.get(signal_name, (
        f"died ({signal_name})", "num_workers=0 to see the failure in the main process",
    ) if signal_name else _EXITED)
    return WorkerDied(f"DataLoader worker (pid {pids}) {what}", key="data.num_workers", fix=f"Try {remedy}.")


class WorkerDeathGuard:
    """While active, a worker death surfaces only inside ``fetching()`` blocks."""

    def __init__(self) -> None:
        self.pending: WorkerDied | None = None
        self._fetching = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> WorkerDeathGuard:
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGCHLD"):
            # torch installs its handler at the first iterator with workers; install it
            # now so that ours wraps it instead of being replaced by it.
            data_utils.signal_handling._set_SIGCHLD_handler()
            self._previous = signal.getsignal(signal.SIGCHLD)
            if callable(self._previous):
                signal.signal(signal.SIGCHLD, self._handle)
                self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGCHLD, self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        try:
            self._previous(signum, frame)
        except RuntimeError as error:
            died = worker_death(error)
            if died is None or self._fetching:
                raise
            self.pending = self.pending or died

    @contextlib.contextmanager
    def fetching(self) -> Iterator[None]:
        """A data fetch: a death noticed earlier is raised here; one that happens now
        (torch's handler, or the loader's own liveness check) becomes WorkerDied."""
        if self.pending is not None:
            died, self.pending = self.pending, None
            raise died
        self._fetching = True
        try:
            yield
        except RuntimeError as error:
            died = worker_death(error)
            if died is None:
                raise
            raise died from None
        finally:
            self._fetching = False
