"""Stop signals as a component: handlers only set a flag; the loop decides where to stop.

SIGINT, SIGTERM and one configurable extra signal (SLURM sends SIGUSR1 ahead of its time
limit) request a stop. While the loop is blocked waiting for data, the handler also
raises ``StopRequested`` so a stuck DataLoader cannot hold the stop hostage. A second
SIGINT raises KeyboardInterrupt at once: the user wants out, and the last checkpoint
on disk stays valid because checkpoints are written atomically.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from types import FrameType
from typing import Any, Callable, Iterator

from optimus_preflight.errors import UserError

log = logging.getLogger("optimus_preflight")


class StopRequested(BaseException):
    """Raised inside an interruptible wait when a stop signal arrives. A BaseException,
    so an ``except Exception`` in dataset or check code cannot swallow the stop."""


def signal_number(name: str) -> int:
    value = getattr(signal, name, None)
    if not isinstance(value, signal.Signals):
        raise UserError(
            f"checkpoint.extra_signal={name!r} is not a signal on this platform",
            key="checkpoint.extra_signal",
            fix="Use a signal name such as SIGUSR1 or SIGUSR2, or null for none.",
        )
    return int(value)


class StopSignals:
    def __init__(self, extra_signal: str | None = "SIGUSR1"):
        self.signals = [signal.SIGINT, signal.SIGTERM]
        if extra_signal:
            self.signals.append(signal.Signals(signal_number(extra_signal)))
        self.received: int | None = None
        self._sigint_count = 0
        self._waiting = False
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.received is not None

    def install(self) -> bool:
        """Install the handlers; False (and nothing installed) off the main thread,
        where Python does not allow signal handlers."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("not on the main thread: stop signals will not save a checkpoint")
            return False
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return True

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def chained_handler(self) -> Callable[[int, Any], Any] | None:
        """The handler the received signal had before ours, when it is Python code that
        expects to run (e.g. submitit's requeue-on-timeout); called after the checkpoint."""
        handler = self._previous.get(self.received) if self.received else None
        if callable(handler) and handler is not signal.default_int_handler:
            return handler
        return None

    def request(self, signum: int) -> None:
        """Record a stop as if ``signum`` had arrived (other ranks' requests, tests)."""
        if self.received is None:
            self.received = signum

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            self._sigint_count += 1
            if self._sigint_count > 1:
                raise KeyboardInterrupt("second Ctrl+C: stopping without a new checkpoint")
        first = self.received is None
        self.request(signum)
        if first:
            log.warning(
                "received %s: stopping at an optimizer-step boundary and saving a checkpoint%s",
                signal.Signals(signum).name,
                " (Ctrl+C again to quit at once)" if signum == signal.SIGINT else "",
            )
        if self._waiting:
            raise StopRequested(signal.Signals(signum).name)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Within this block a stop signal raises StopRequested instead of waiting."""
        if self.requested:
            raise StopRequested(signal.Signals(self.received).name)
        self._waiting = True
        try:
            yield
        finally:
            self._waiting = False
