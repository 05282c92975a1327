"""The data watchdog: a wait for a training batch that outlasts its timeout becomes a stop.

A DataLoader worker that blocks (a dataset waiting on a dead NFS mount, a lock, a
SIGSTOPped process) would hold the main thread in ``next(loader)`` forever, silently.
Each wait for a training batch runs inside ``watching()``; a daemon thread notices when
one passes ``timeout_s``, asks ``describe`` where the data code blocks (the main
thread's stack, which it reads with ``sys._current_frames()``, or the workers' stacks),
then ends the wait: it sends ``INTERRUPT_SIGNAL`` to the main thread, whose handler
raises ``StopRequested`` inside the wait (a sleep, a queue or lock wait returns EINTR,
and Python runs the handler there). From then on the run stops as after a stop signal:
at the last step boundary, with a checkpoint; the window in flight is abandoned and
replayed on resume. A wait that does not end even then (a C call that retries EINTR)
is ended with the process after ``ESCALATE_S`` by ``on_stuck``: the last checkpoint on
disk stays valid.

``INTERRUPT_SIGNAL`` is SIGURG: ignored by default, so a stray one is harmless, and no
training process uses it. Only the main thread receives it (``pthread_kill``), and the
handler raises only while the wait it was sent for is still on.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from optimus_preflight.checkpoint.signals import StopRequested

log = logging.getLogger("optimus_preflight")

INTERRUPT_SIGNAL = getattr(signal, "SIGURG", None)
# How long an interrupted wait may take to end before the process is ended instead.
ESCALATE_S = 10.0


@dataclass
class Stall:
    """Where the data code blocked when the watchdog fired."""

    timeout_s: float
    where: str = "the main process"  # or "DataLoader worker 0 (pid 123)"
    frame: str | None = None  # 'File "x.py", line 12, in __getitem__: time.sleep(3600)'
    stack: list[str] = field(default_factory=list)  # the blocking thread's frames, innermost first
    state: str = ""  # without a frame: "is stopped (SIGSTOP ...)"; default "blocks"
    what: str = "training batch"  # or "evaluation batch"

    def headline(self) -> str:
        """One line: what did not come, and where the data code blocks."""
        state = f"blocks at {self.frame}" if self.frame else (self.state or "blocks")
        return f"no {self.what} within {self.timeout_s:g} s: {self.where} {state}"


# (the iterator waited on, or None: the training stream's; the main thread's stack) -> Stall
Describe = Callable[[Any, traceback.StackSummary], Stall]


class FetchWatchdog:
    """Watches the waits for training batches (see the module docstring).

    ``describe(subject, main_stack)`` names the hang (called on the watchdog's thread,
    with what ``watching`` was given and the main thread's stack at that moment); ``on_stall(stall)`` records it before the wait is
    interrupted; ``on_stuck(stall)`` ends the process when the interrupted wait does not
    end within ``escalate_s``.
    """

    def __init__(self, timeout_s: float, *, describe: Describe, on_stall: Callable[[Stall], object],
                 on_stuck: Callable[[Stall], object], escalate_s: float = ESCALATE_S):
        self.timeout_s = float(timeout_s)
        self.describe = describe
        self.on_stall = on_stall
        self.on_stuck = on_stuck
        self.escalate_s = escalate_s
        self.stall: Stall | None = None
        self._changed = threading.Condition()
        self._started: float | None = None  # when the current wait began; None between waits
        self._subject: Any = None  # what the current wait waits on (a loader iterator), for describe
        self._wait_id = 0
        self._interrupting: int | None = None  # the wait the interrupt was sent for
        self._closed = False
        self._thread: threading.Thread | None = None
        self._previous: Any = None
        self._main_ident = threading.main_thread().ident

    def install(self) -> bool:
        """Start the thread and take INTERRUPT_SIGNAL; False (and nothing done) off the main
        thread, where Python allows no signal handler: waits are then not watched."""
        if INTERRUPT_SIGNAL is None or threading.current_thread() is not threading.main_thread():
            log.warning("data.fetch_timeout_s: not on the main thread: waits for training data are not watched")
            return False
        self._previous = signal.signal(INTERRUPT_SIGNAL, self._handle)
        self._thread = threading.Thread(target=self._watch, name="optimus-data-watchdog", daemon=True)
        self._thread.start()
        return True

    def uninstall(self) -> None:
        if self._thread is None:
            return
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread = None
        signal.signal(INTERRUPT_SIGNAL, self._previous)

    @contextmanager
    def watching(self, subject: Any = None) -> Iterator[None]:
        """One wait for a batch (of ``subject``, a loader iterator; None: the training stream's)."""
        if self._thread is None:
            yield
            return
        with self._changed:
            self._wait_id += 1
            self._started = time.monotonic()
            self._subject = subject
            self._changed.notify_all()
        try:
            yield
        finally:
            with self._changed:
                self._started = None
                self._subject = None
                self._changed.notify_all()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # No lock here: the main thread may hold it (inside watching()).
        if self._interrupting is not None and self._interrupting == self._wait_id and self._started is not None:
            raise StopRequested("data watchdog")
        if callable(self._previous):
            self._previous(signum, frame)

    def _overdue(self) -> int | None:
        """Wait (holding the lock) until a wait passes its timeout; its id, or None once closed."""
        while not self._closed:
            if self._started is None:
                self._changed.wait()
                continue
            remaining = self._started + self.timeout_s - time.monotonic()
            if remaining > 0:
                self._changed.wait(remaining)
                continue
            return self._wait_id
        return None

    def _watch(self) -> None:
        while (stall := self._next_stall()) is not None:
            wait_id, stall = stall
            with self._changed:
                if self._closed or self._wait_id != wait_id or self._started is None:
                    continue  # the batch came while the stacks were read: watch on
                self.stall = stall
                self.on_stall(stall)
                self._interrupting = wait_id
                signal.pthread_kill(self._main_ident, INTERRUPT_SIGNAL)
                deadline = time.monotonic() + self.escalate_s
                while self._still_waiting(wait_id) and (remaining := deadline - time.monotonic()) > 0:
                    self._changed.wait(remaining)
                stuck = self._still_waiting(wait_id)
            if stuck:
                self.on_stuck(stall)
            return  # the run is stopping: one stall is enough

    def _still_waiting(self, wait_id: int) -> bool:
        return not self._closed and self._wait_id == wait_id and self._started is not None

    def _next_stall(self) -> tuple[int, Stall] | None:
        """The next wait that passes its timeout, described; None once closed."""
        with self._changed:
            wait_id = self._overdue()
            subject = self._subject
        if wait_id is None:
            return None
        main = sys._current_frames().get(self._main_ident)
        stack = traceback.extract_stack(main) if main is not None else traceback.StackSummary()
        try:
            return wait_id, self.describe(subject, stack)
        except Exception as error:  # noqa: BLE001 - naming the hang must not keep it from ending
            log.warning("data watchdog: could not read the stacks: %r", error)
            return wait_id, Stall(self.timeout_s)
