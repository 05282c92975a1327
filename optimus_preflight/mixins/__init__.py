from optimus_preflight.mixins.context import TrainingContextMixin
from optimus_preflight.mixins.interruption import TrainingInterruptionMixin
from optimus_preflight.mixins.iteration import TrainingIterationMixin
from optimus_preflight.mixins.preflight import PreflightMixin

__all__ = ["TrainingContextMixin", "PreflightMixin", "TrainingIterationMixin", "TrainingInterruptionMixin"]
