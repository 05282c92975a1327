"""optimus_preflight: PyTorch training recipes that check a run before it wastes a GPU-hour."""

from optimus_preflight.config.compose import compose
from optimus_preflight.errors import PreflightFailed, TrainingInterrupted, UserError
from optimus_preflight.recipe import TrainRecipe

__all__ = ["TrainRecipe", "compose", "UserError", "PreflightFailed", "TrainingInterrupted"]
__version__ = "0.1.0"
