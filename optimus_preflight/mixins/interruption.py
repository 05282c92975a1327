from __future__ import annotations

import contextlib
import logging
import signal
import time
from typing import Any, Callable, ContextManager, NoReturn

from omegaconf import OmegaConf

from optimus_preflight.checkpoint import RunCheckpointer, resume_command
from optimus_preflight.checkpoint.state import Restorable
from optimus_preflight.errors import TrainingInterrupted
from optimus_preflight.forced_exit import say, second_ctrl_c_message

log = logging.getLogger("optimus_preflight")


class TrainingInterruptionMixin:
    """Ctrl+C, SIGTERM and SIGUSR1 become a checkpoint at an optimizer-step boundary and
    exit 128+signal; periodic and final checkpoints; resume. Owns ``self.interruption``."""

    interruption: RunCheckpointer | None = None

    def setup_interruption(self) -> RunCheckpointer:
        checkpoint = self.cfg.checkpoint
        self.interruption = RunCheckpointer(
            self.run_dir,
            every_n_steps=checkpoint.every_n_steps,
            keep_last=checkpoint.keep_last,
            extra_signal=checkpoint.extra_signal,
            dist=self.training_context.dist,
            config=OmegaConf.to_container(self.cfg, resolve=True),
            stop_timeout_s=checkpoint.stop_timeout_s,
            progress=self._progress,
        )
        # A forced exit (second Ctrl+C, silent torchrun peer) runs on another thread
        # while the main one may be mid-step, so it writes the summary without hashing
        # weights that may be mid-update.
        self.interruption.forced_exit.last_words.append(
            lambda status: self.write_summary(self.build_summary(status, time.monotonic() - self.started_at, hash_params=False))
        )
        self.interruption.signals.force_quit = self.quit_at_once
        return self.interruption

    def quit_at_once(self) -> None:
        """The second Ctrl+C: no new checkpoint, exit 130 now, even from inside a C++ op."""
        interruption = self.interruption
        message = lambda: say(second_ctrl_c_message(interruption.last_checkpoint(), resume_command(self.run_dir)))  # noqa: E731
        interruption.forced_exit.run(128 + signal.SIGINT, "interrupted", [("message", message)])

    def flush_on_forced_exit(self, flush: Callable[[], object]) -> None:
        """Register a flush (metrics.jsonl's) for a forced exit to run before it ends the process."""
        if self.interruption is not None:
            self.interruption.forced_exit.last_words.append(lambda status: flush())

    def start_interruption_handling(self) -> dict[str, Any] | None:
        """Install the signal handlers, then resume per ``checkpoint.resume``."""
        parts = Restorable(self.model, self.optimizer, self.scheduler, self.training_context.scaler, self.state, self.training_iteration.stream)
        self.interruption.start(parts)
        progress = self.interruption.resume(self.cfg.checkpoint.resume)
        self.interruption.mark_boundary()
        return progress

    def interruptible(self) -> ContextManager:
        """A block in which a stop signal ends the current wait at once (StopRequested).
        Under DDP a rank may not leave alone, so there it only sets the flag."""
        if self.interruption is None or self.training_context.dist.is_distributed:
            return contextlib.nullcontext()
        return self.interruption.signals.interruptible()

    def stop_requested(self) -> bool:
        return self.interruption is not None and self.interruption.stop_requested_in_window()

    def handle_training_interruption(self, progress: dict[str, Any]) -> NoReturn:
        path = self.interruption.save(progress)
        signum = self.interruption.signals.received or signal.SIGINT
        log.warning(
            "stopped by %s at step %d; checkpoint %s. Resume with:\n  %s",
            signal.Signals(signum).name, self.state.step, path, resume_command(self.run_dir),
        )
        raise TrainingInterrupted(signum, self.state.step, str(path), self.interruption.signals.chained_handler())
