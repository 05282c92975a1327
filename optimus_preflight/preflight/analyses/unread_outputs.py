"""Which of the model's returned tensors the loss never reads.

A model that returns several tensors (N-BEATS' (backcast, forecast), a multi-task model's
heads, an encoder's (output, hidden)) leaves the loss to pick among them: reading out[0] where
out[1] was meant trains the wrong head, and the one meant gets no gradient. Told apart from a
result dropped inside the forward by the model's own output: the element holding the untrained
layers' result is returned, and the loss's gradient with respect to it is None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


def unread_output(ctx: PreflightContext, untrained: list[str]) -> tuple[int, int, list[int]] | None:
    """(position of the returned tensor computed from the ``untrained`` parameters that the loss
    never reads, number of returned tensors, positions it reads) for the first batch; None when
    the model returns one tensor, or the untrained layers' result is not among its returns."""
    params = dict(ctx.model.named_parameters())
    wanted = [params[name] for name in untrained if name in params]
    if not wanted:
        return None
    returned: list[list[torch.Tensor]] = []

    def keep(module: nn.Module, args: Any, output: Any) -> None:
        if not returned:
            returned.append([leaf for leaf in leaves(output) if isinstance(leaf, torch.Tensor)])

    with preserved_training_state(ctx), torch.enable_grad():
        handle = ctx.model.register_forward_hook(keep)
        try:
            ctx.model.eval()
            output = ctx.compute_loss(ctx.model, move_to_device(ctx.artifacts.first_batch, ctx.device))
        except Exception:  # noqa: BLE001 - the explanation is optional; the finding stands without it
            return None
        finally:
            handle.remove()
        loss = output[0] if isinstance(output, tuple) else output
        outputs = returned[0] if returned else []
        graded = [t for t in outputs if t.requires_grad]
        if len(outputs) < 2 or len(graded) != len(outputs) or not isinstance(loss, torch.Tensor) \
                or not loss.requires_grad:
            return None
        read = torch.autograd.grad(loss, outputs, allow_unused=True, retain_graph=True)
        read_positions = [i for i, grad in enumerate(read) if grad is not None]
        for position, (tensor, grad) in enumerate(zip(outputs, read, strict=True)):
            if grad is not None:
                continue
            reaches = torch.autograd.grad(tensor.float().sum(), wanted, allow_unused=True, retain_graph=True)
            if any(g is not None for g in reaches):
                return position, len(outputs), read_positions
    return None
