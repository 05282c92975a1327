from optimus_preflight.mixins.context_mixin import TrainingContextMixin
from optimus_preflight.mixins.interruption_mixin import TrainingInterruptionMixin
from optimus_preflight.mixins.iteration_mixin import TrainingIterationMixin
from optimus_preflight.mixins.preflight_mixin import PreflightMixin

__all__ = ["TrainingContextMixin", "PreflightMixin", "TrainingIterationMixin", "TrainingInterruptionMixin"]
