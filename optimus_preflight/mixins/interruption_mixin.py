from __future__ import annotations

from typing import ClassVar, ContextManager, NoReturn

from omegaconf import OmegaConf

from optimus_preflight.checkpoint import RunCheckpointer
from optimus_preflight.checkpoint.checkpoint_state import Restorable
from optimus_preflight.mixins.contracts import InterruptionHost
from optimus_preflight.training.training_context import TrainingContext


class TrainingInterruptionMixin:
    """Ctrl+C, SIGTERM and SIGUSR1 become a checkpoint at an optimizer-step boundary and
    exit 128+signal; periodic and final checkpoints; resume (``RunCheckpointer``).

    Owns ``self.interruption``.
    """

    HOST: ClassVar[type] = InterruptionHost
    interruption: RunCheckpointer | None = None

    def setup_interruption(self: InterruptionHost, context: TrainingContext, parts: Restorable) -> RunCheckpointer:
        """Create the checkpointer over ``parts`` and install the stop-signal handlers."""
        checkpoint = self.cfg.checkpoint
        self.interruption = RunCheckpointer(
            self.run_dir, every_n_steps=checkpoint.every_n_steps, keep_last=checkpoint.keep_last,
            extra_signal=checkpoint.extra_signal, dist=context.dist, stop_timeout_s=checkpoint.stop_timeout_s,
            config=OmegaConf.to_container(self.cfg, resolve=True),
        )
        self.interruption.add_last_words(self.write_forced_summary)
        self.interruption.start(parts)
        return self.interruption

    def interruptible(self) -> ContextManager:
        return self.interruption.interruptible()

    def stop_requested(self) -> bool:
        return self.interruption is not None and self.interruption.stop_requested_in_window()

    def handle_training_interruption(self) -> NoReturn:
        self.interruption.stop_here()
