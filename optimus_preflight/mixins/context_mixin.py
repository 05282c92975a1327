from __future__ import annotations

from typing import Any

import torch

from optimus_preflight.mixins.options import TrainerSettings, trainer_options
from optimus_preflight.training.training_context import TrainingContext, build_training_context


class TrainingContextMixin:
    """Device, precision (autocast dtype), seeds and the GradScaler.

    ``TrainingContextMixin(optimization_config)``: the trainer settings (see
    ``mixins.options``). ``setup_training_context(device)`` returns the context, a mapping
    with ``scaler``, ``amp_ctx`` (an autocast context to enter around each forward),
    ``amp_cfg`` and ``device`` (optimus_dl's keys), and keeps it as
    ``self.training_context``. fp16 enables the scaler; bf16 and fp32 leave it a no-op
    whose (empty) state is still checkpointed, so switching precision between a run and
    its resume is caught rather than silently mis-scaled.
    """

    optimization_config: TrainerSettings
    training_context: TrainingContext | None = None

    def __init__(self, optimization_config: Any = None):
        self.optimization_config = trainer_options(optimization_config)

    def setup_training_context(self, device: torch.device | str | None = None) -> TrainingContext:
        """``device``: where to train; None: the settings' ``device`` (auto: CUDA if present)."""
        self.training_context = build_training_context(self.optimization_config, device=device)
        return self.training_context
