"""Validation loss: the same loss as training, weighted by targets, without gradients."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader

from optimus_preflight.training.batches import move_to_device
from optimus_preflight.training.precision import PrecisionPlan
from optimus_preflight.training.step import split_loss_output


def evaluate(
    model: nn.Module,
    loader: DataLoader,
    compute_loss: Callable[[nn.Module, Any], Any],
    plan: PrecisionPlan,
    *,
    max_batches: int | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    reduce_sum: Callable[[Any], torch.Tensor] | None = None,
) -> float | None:
    """Mean validation loss over up to ``max_batches`` batches; None if stopped early or empty.

    Leaves the model in the mode it found it in.
    """
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=plan.device)
    count_sum: Any = 0
    try:
        with torch.no_grad():
            for index, batch in enumerate(loader):
                if max_batches is not None and index >= max_batches:
                    break
                if should_stop():
                    return None
                batch = move_to_device(batch, plan.device, non_blocking=plan.device.type == "cuda")
                with plan.autocast():
                    loss, count = split_loss_output(compute_loss(model, batch), batch)
                loss_sum += loss.double() * count
                count_sum = count_sum + count
    finally:
        model.train(was_training)
    if reduce_sum is not None:  # every rank evaluated its shard of the validation set
        loss_sum, count_sum = reduce_sum(loss_sum), reduce_sum(count_sum)
    if float(count_sum) == 0:
        return None
    return float(loss_sum / count_sum)
