"""Stop signals and forced exits of one run, as one component.

A stop signal (SIGINT, SIGTERM, the configured extra one) only sets a flag: the loop
stops at its next step boundary. While the loop waits for data the wait ends at once
(``interruptible``). A second Ctrl+C ends the process now with exit 130, naming the last
checkpoint on disk, after the ``last_words`` (summary.json, the metric files).
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Callable, ContextManager

from optimus_preflight.checkpoint.forced_exit import ForcedExit, say, second_ctrl_c_message
from optimus_preflight.checkpoint.signals import StopSignals
from optimus_preflight.training.distributed import DistEnv


class StopControl:
    def __init__(self, extra_signal: str | None, dist: DistEnv, *, resume_hint: Callable[[], str],
                 last_checkpoint: Callable[[], Path | None] = lambda: None):
        self.signals = StopSignals(extra_signal)
        self.dist = dist
        self.resume_hint = resume_hint
        self.last_checkpoint = last_checkpoint
        self.forced_exit = ForcedExit()
        self.signals.force_quit = self._quit_at_once

    def install(self) -> None:
        self.signals.install()

    def uninstall(self) -> None:
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

    @property
    def requested(self) -> bool:
        return self.signals.requested

    @property
    def received(self) -> int | None:
        return self.signals.received

    def requested_in_window(self) -> bool:
        """May a step abandon its accumulation window now? Under DDP one rank cannot: the
        others would wait in its all-reduce forever. Ranks agree at the step boundary."""
        return self.signals.requested and not self.dist.is_distributed

    def interruptible(self) -> ContextManager:
        """A block in which a stop signal ends the current wait at once (StopRequested).
        Under DDP a rank may not leave alone, so there it only sets the flag."""
        if self.dist.is_distributed:
            return contextlib.nullcontext()
        return self.signals.interruptible()
