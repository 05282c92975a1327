"""Stop signals and forced exits of one run, as one component.

A stop signal (SIGINT, SIGTERM, the configured extra one) only sets a flag: the loop
stops at its next step boundary. While the loop waits for data the wait ends at once
(``interruptible``). A second Ctrl+C ends the process now with exit 130, naming the last
checkpoint on disk, after the ``last_words`` (summary.json, the metric files). With a
``fetch_timeout_s``, a wait for a training batch that outlasts it is a stop too (the data
watchdog, ``fetch_watchdog.py``): ``stall`` then says where the data code blocks.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, ContextManager

from optimus_preflight.checkpoint.fetch_watchdog import Describe, FetchWatchdog, Stall
from optimus_preflight.checkpoint.forced_exit import ForcedExit, say, second_ctrl_c_message
from optimus_preflight.checkpoint.signals import StopRequested, StopSignals
from optimus_preflight.config.invocation import speaker
from optimus_preflight.errors import EXIT_USER_ERROR
from optimus_preflight.training.distributed import DistEnv

log = logging.getLogger("optimus_preflight")


class StopControl:
    def __init__(self, extra_signal: str | None, dist: DistEnv, *, resume_hint: Callable[[], str],
                 last_checkpoint: Callable[[], Path | None] = lambda: None,
                 fetch_timeout_s: float | None = None, describe_stall: Describe | None = None):
        self.signals = StopSignals(extra_signal)
        self.dist = dist
        self.resume_hint = resume_hint
        self.last_checkpoint = last_checkpoint
        self.forced_exit = ForcedExit()
        self.signals.force_quit = self._quit_at_once
        # Where the data code blocked, once the watchdog stopped the run.
        self.stall: Stall | None = None
        # Under torchrun: another rank's data stalled and this one exits (summary.json's stop_reason).
        self.peer_stall: str | None = None
        self.watchdog = None if fetch_timeout_s is None else FetchWatchdog(
            fetch_timeout_s, describe=describe_stall or (lambda subject, stack: Stall(fetch_timeout_s)),
            on_stall=self._stalled, on_stuck=self._quit_stuck)

    def install(self) -> None:
        self.signals.install()
        if self.watchdog is not None:
            self.watchdog.install()

    def uninstall(self) -> None:
        if self.watchdog is not None:
            self.watchdog.uninstall()
        self.signals.uninstall()

    def add_last_words(self, word: Callable[[str], object]) -> None:
        """Something a forced exit (a second Ctrl+C, a silent torchrun peer) does before
        it ends the process, given the run's status: write summary.json, flush metrics.
        It runs on another thread while the main one may be mid-step."""
        self.forced_exit.last_words.append(word)

    def _quit_at_once(self) -> None:
        """The second Ctrl+C: no new checkpoint, exit 130 now, even from inside a C++ op."""
        message = lambda: say(second_ctrl_c_message(self.last_checkpoint(), self.resume_hint()))  # noqa: E731
        self.forced_exit.run(128 + signal.SIGINT, "interrupted", [("message", message)])

    def _stalled(self, stall: Stall) -> None:
        self.stall = stall
        log.warning("%s; stopping at the last optimizer-step boundary", stall.headline())

    def _quit_stuck(self, stall: Stall) -> None:
        """The interrupted wait did not end (a C call that retries EINTR): end the process
        without a new checkpoint; the last one on disk is intact."""
        last = self.last_checkpoint()
        where = f"the last checkpoint on disk is {last} (intact)" if last else "no checkpoint on disk yet"
        message = lambda: say(f"{speaker()}: error: {stall.headline()}; the wait did not end when interrupted: "  # noqa: E731
                              f"stopped at once; {where}. Resume with: {self.resume_hint()}")
        self.forced_exit.run(EXIT_USER_ERROR, "failed", [("message", message)])

    @property
    def requested(self) -> bool:
        """A stop signal arrived, or the data watchdog fired."""
        return self.signals.requested or self.stall is not None

    @property
    def received(self) -> int | None:
        return self.signals.received

    def requested_in_window(self) -> bool:
        """May a step abandon its accumulation window now? Under DDP one rank cannot: the
        others would wait in its all-reduce forever. Ranks agree at the step boundary."""
        return self.requested and not self.dist.is_distributed

    def interruptible(self) -> ContextManager:
        """A block in which a stop signal ends the current wait at once (StopRequested).
        Under DDP a rank may not leave alone, so there it only sets the flag."""
        if self.dist.is_distributed:
            return contextlib.nullcontext()
        return self.signals.interruptible()

    @contextlib.contextmanager
    def fetching(self, subject: Any = None) -> Iterator[None]:
        """A wait for a batch: interruptible, and watched by the data watchdog. ``subject``:
        the loader iterator waited on (None: the training stream's), for naming a stall."""
        if self.stall is not None:
            raise StopRequested("data watchdog")
        with self.interruptible():
            if self.watchdog is None:
                yield
            else:
                with self.watchdog.watching(subject):
                    yield
