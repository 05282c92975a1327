"""Old path of ``training.loaders`` (``build_loader``, ``ResumableSampler``) and the batch
helpers now in ``training.batches``, kept for user code."""

from optimus_preflight.training.batches import batch_size_of, move_to_device  # noqa: F401
from optimus_preflight.training.loaders import *  # noqa: F401,F403
