from __future__ import annotations

from typing import ClassVar

from optimus_preflight.mixins.contracts import ConfiguredHost
from optimus_preflight.training.training_context import TrainingContext, build_training_context


class TrainingContextMixin:
    """Device, precision (autocast dtype), seeds and the GradScaler.

    Owns ``self.training_context``. fp16 enables the scaler; bf16 and fp32 leave it a
    no-op whose (empty) state is still checkpointed, so switching precision between a
    run and its resume is caught rather than silently mis-scaled.
    """

    HOST: ClassVar[type] = ConfiguredHost
    training_context: TrainingContext

    def setup_training_context(self: ConfiguredHost) -> TrainingContext:
        self.training_context = build_training_context(self.cfg.trainer)
        return self.training_context
