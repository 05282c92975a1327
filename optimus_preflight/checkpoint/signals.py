"""Stop signals as a component: handlers only set a flag; the loop decides where to stop.

SIGINT, SIGTERM, SIGHUP (unless ignored, as under nohup) and one configurable extra signal (SLURM sends SIGUSR1 ahead of its time
limit) request a stop. While the loop is blocked waiting for data, the handler also
raises ``StopRequested`` so a stuck DataLoader cannot hold the stop hostage. A second
SIGINT calls ``force_quit`` (or raises KeyboardInterrupt when none is set): the user
wants out, and the last checkpoint on disk stays valid because checkpoints are written
atomically.

Python runs signal handlers only between bytecodes, so while the main thread sits in a
long C++ op (a backward, a big matmul, torch.save) the handlers wait for seconds. A
``SignalWatcher`` thread sees each signal at once through ``signal.set_wakeup_fd`` (the
C-level handler writes the signal number to a pipe immediately) and torch releases the
GIL in its heavy ops, so the watcher can act while the main thread is still busy.
"""

from __future__ import annotations

import contextlib
import logging
import os
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


_WATCHERS: set[SignalWatcher] = set()


class SignalWatcher:
    """Calls ``on_signal(signum)`` from a daemon thread for every signal that reaches a
    Python-level handler, as soon as it arrives (see the module docstring)."""

    def __init__(self, on_signal: Callable[[int], object]):
        self.on_signal = on_signal
        self._fds: tuple[int, int] | None = None
        self._previous_fd = -1

    def start(self) -> bool:
        """Main thread only (Python's rule for the wakeup fd); False if it cannot be set."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # required by set_wakeup_fd
        try:
            self._previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:
            os.close(read_fd)
            os.close(write_fd)
            return False
        self._fds = (read_fd, write_fd)
        _WATCHERS.add(self)
        threading.Thread(target=self._watch, args=(read_fd,), name="optimus-signal-watcher", daemon=True).start()
        return True

    def stop(self) -> None:
        if self._fds is None:
            return
        _WATCHERS.discard(self)
        read_fd, write_fd = self._fds
        self._fds = None
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(self._previous_fd)
        with contextlib.suppress(OSError):
            os.write(write_fd, b"\0")  # no signal is 0: tells the thread to end
        os.close(write_fd)

    def _watch(self, read_fd: int) -> None:
        try:
            while data := os.read(read_fd, 512):
                for signum in data:
                    if signum == 0:
                        return
                    try:
                        self.on_signal(signum)
                    except Exception:  # a failing reaction must not stop the watching
                        log.exception("signal watcher: reacting to signal %d failed", signum)
        finally:
            os.close(read_fd)

    def _forget_in_child(self) -> None:
        # A forked child (a DataLoader worker) must neither report its own signals into
        # the parent's pipe, where they would count as the parent's, nor keep it open.
        _WATCHERS.discard(self)
        if self._fds is not None:
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(-1)
            for fd in self._fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds = None


def _forget_watchers_in_child() -> None:
    for watcher in list(_WATCHERS):
        watcher._forget_in_child()


os.register_at_fork(after_in_child=_forget_watchers_in_child)


class StopSignals:
    def __init__(self, extra_signal: str | None = "SIGUSR1"):
        self.signals = [signal.SIGINT, signal.SIGTERM]
        if extra_signal:
            self.signals.append(signal.Signals(signal_number(extra_signal)))
        self.received: int | None = None
        # Called on the second SIGINT, from the watcher thread or the handler, whichever
        # sees it first: it must end the process (see optimus_preflight.checkpoint.forced_exit).
        self.force_quit: Callable[[], object] | None = None
        # The first stop signal as the watcher saw it: set even while the main thread
        # is stuck in C++ and ``received`` (set by the Python handler) is not yet.
        self.seen: int | None = None
        self._sigint_count = 0
        self._seen_sigints = 0
        self._waiting = False
        self._previous: dict[int, Any] = {}
        self._watcher = SignalWatcher(self._on_seen)
        self._pid = os.getpid()

    @property
    def requested(self) -> bool:
        return self.received is not None

    @property
    def stop_seen(self) -> bool:
        return self.received is not None or self.seen is not None

    def install(self) -> bool:
        """Install the handlers and the watcher; False (and nothing installed) off the
        main thread, where Python does not allow signal handlers."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("not on the main thread: stop signals will not save a checkpoint")
            return False
        self._pid = os.getpid()
        # SIGHUP (an ssh session that drops, a terminal closed) stops the run like
        # SIGTERM, unless the process was started to ignore it (nohup, setsid wrappers).
        hangup = getattr(signal, "SIGHUP", None)
        if hangup is not None and hangup not in self.signals and signal.getsignal(hangup) is not signal.SIG_IGN:
            self.signals.append(hangup)
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        if not self._watcher.start():
            log.warning("could not watch signals from a thread: a second Ctrl+C acts only between Python bytecodes")
        return True

    def uninstall(self) -> None:
        self._watcher.stop()
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

    def _on_seen(self, signum: int) -> None:
        """The watcher thread's view of a signal (the Python handler still runs later)."""
        if signum not in self.signals:
            return
        if self.seen is None:
            self.seen = signum
        if signum == signal.SIGINT:
            self._seen_sigints += 1
            if self._seen_sigints > 1 and self.force_quit is not None:
                self.force_quit()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            self._sigint_count += 1
            if self._sigint_count > 1:
                # A forked DataLoader worker inherits this handler but not the run it
                # would write for: there the old way out stays.
                if self.force_quit is not None and os.getpid() == self._pid:
                    self.force_quit()
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
