"""One eval-mode, no-grad ``compute_loss`` on a batch, the model's state put back after.

Checks that observe a forward through hooks (what a module receives, what the model
returns) register them, call ``eval_forward``, and read what the hooks saw: dropout off
and BatchNorm on its running statistics, so samples are independent and outputs
deterministic unless the model samples on purpose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


def eval_forward(ctx: PreflightContext, batch: Any) -> Any:
    """``compute_loss(model, batch)`` in eval mode without gradients; raises what it raises."""
    with preserved_training_state(ctx), torch.no_grad():
        ctx.model.eval()
        with ctx.training.plan.autocast():
            return ctx.compute_loss(ctx.model, move_to_device(batch, ctx.device))
