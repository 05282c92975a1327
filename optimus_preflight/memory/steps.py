"""The training steps whose memory is estimated (on fake tensors) or measured (on real ones).

One function runs both, so the estimate and the measurement see the same sequence of
allocations: per optimizer step, ``accumulation_steps`` micro-batches of forward (under
autocast) and backward, then ``optimizer.step()`` and ``zero_grad(set_to_none=True)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.memory.tracker import StorageTracker
from optimus_preflight.training.precision import autocast_dtype


def scalar_loss(output: Any) -> torch.Tensor:
    """``loss_fn`` returns a scalar loss, or ``(loss, count)`` as a recipe's compute_loss does."""
    loss = output[0] if isinstance(output, (tuple, list)) else output
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(f"loss_fn must return a scalar tensor or (loss, count); got {type(loss).__name__}")
    return loss.reshape(())


def optimizer_state_tensors(optimizer: Optimizer) -> list[torch.Tensor]:
    return [value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


class _NoTracker:
    """Stands in for a tracker when the steps run for real on a GPU (the allocator counts)."""

    phase = where = ""

    def relabel(self, tensors: object, category: str) -> None:
        pass


def run_training_steps(
    model: nn.Module,
    optimizer: Optimizer,
    make_batch: Callable[[], Any],
    loss_fn: Callable[[nn.Module, Any], Any],
    tracker: StorageTracker | None,
    *,
    precision: str = "fp32",
    accumulation_steps: int = 1,
    steps: int = 2,
    device_type: str = "cpu",
    scaler: torch.amp.GradScaler | None = None,
    autocast_policy: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> None:
    """``autocast_policy`` adds rules on top of autocast during the forward (see cuda_autocast)."""
    dtype = autocast_dtype(precision)
    track: Any = tracker if tracker is not None else _NoTracker()
    params = [p for p in model.parameters() if p.requires_grad]
    for step in range(1, steps + 1):
        for micro in range(1, accumulation_steps + 1):
            label = f"step {step}" + (f", micro-batch {micro}" if accumulation_steps > 1 else "")
            track.phase, track.where = "inputs", f"{label}, batch"
            batch = make_batch()
            track.phase, track.where = "activations", f"{label}, forward"
            autocast = torch.autocast(device_type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
            policy = (
                autocast_policy() if autocast_policy is not None and dtype is not None else contextlib.nullcontext()
            )
            with autocast, policy:
                output = loss_fn(model, batch)
            loss = scalar_loss(output)
            if accumulation_steps > 1:
                loss = loss / accumulation_steps
            track.phase, track.where = "backward_temporaries", f"{label}, backward"
            (scaler.scale(loss) if scaler is not None else loss).backward()
            del output, loss, batch
            track.relabel([p.grad for p in params if p.grad is not None], "grads")
        track.phase, track.where = "optimizer_temporaries", f"step {step}, optimizer.step"
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        track.relabel(optimizer_state_tensors(optimizer), "optimizer_state")
        track.phase, track.where = "other", f"step {step}, zero_grad"
        optimizer.zero_grad(set_to_none=True)
