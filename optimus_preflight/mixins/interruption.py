from __future__ import annotations

import contextlib
import logging
import signal
from typing import Any, ContextManager, NoReturn

from omegaconf import OmegaConf

from optimus_preflight.checkpoint import RunCheckpointer, resume_command
from optimus_preflight.checkpoint.state import Restorable
from optimus_preflight.errors import TrainingInterrupted

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
        )
        return self.interruption

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
