"""How long a run is: trainer.max_steps, trainer.max_epochs, or both (the first limit
reached ends the run), in optimizer steps once the training loader is known."""

from __future__ import annotations

import math
from typing import Any

from optimus_preflight.errors import UserError


def optimizer_steps_per_epoch(loader: Any, accumulation_steps: int) -> int | None:
    """Optimizer steps in one pass over ``loader``; None for a loader without a length.
    An accumulation window never crosses an epoch's end (training/stream.py), so a
    short last window is a step of its own."""
    try:
        batches = len(loader)
    except TypeError:  # an IterableDataset without __len__
        return None
    return max(1, math.ceil(batches / accumulation_steps))


def planned_max_steps(max_steps: int | None, max_epochs: int | None, steps_per_epoch: int | None) -> int:
    """The run's length in optimizer steps."""
    if max_epochs is None:
        if max_steps is None:
            raise UserError("neither trainer.max_steps nor trainer.max_epochs is set", key="trainer.max_steps",
                            fix="Set trainer.max_steps=1000 (optimizer steps) or trainer.max_epochs=10.")
        return max_steps
    if steps_per_epoch is None:
        raise UserError(
            "trainer.max_epochs is set, but the training loader has no length (an IterableDataset), so the "
            "number of steps an epoch takes is unknown until it ends",
            key="trainer.max_epochs",
            fix="Set trainer.max_epochs=null and trainer.max_steps to the optimizer steps to run, or give the "
            "dataset a __len__.",
        )
    by_epochs = max_epochs * steps_per_epoch
    return by_epochs if max_steps is None else min(max_steps, by_epochs)
