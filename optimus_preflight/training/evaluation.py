"""Evaluation over a whole loader: the recipe's ``validation_step`` (by default the
training loss) and whatever it logs, each averaged over every sample, without gradients."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader

from optimus_preflight.errors import UserError
from optimus_preflight.training.batches import batch_size_of, move_to_device
from optimus_preflight.training.precision import PrecisionPlan
from optimus_preflight.training.user_metrics import MetricCollector

StepFn = Callable[[nn.Module, Any], Any]


def step_metrics(output: Any, batch: Any, method: str = "validation_step") -> tuple[dict[str, Any], Any]:
    """A validation step's return value as (metrics, weight). It may return a dict of
    metrics, a loss tensor (the metric ``loss``), either with a count as ``(x, count)``
    (the samples or targets the values average over), or None when it only calls
    ``self.log``. Without a count, the batch's size weighs it."""
    count = None
    if isinstance(output, tuple):
        if len(output) != 2:
            raise UserError(f"{method} returned a tuple of {len(output)} items", key=None,
                            fix=f"Return a dict of metrics, a loss tensor, or (either, count) from {method}.")
        output, count = output
    if output is None:
        metrics: dict[str, Any] = {}
    elif isinstance(output, Mapping):
        metrics = dict(output)
    elif isinstance(output, torch.Tensor):
        metrics = {"loss": output}
    else:
        raise UserError(f"{method} returned {type(output).__name__}", key=None,
                        fix=f"Return a dict of metrics (e.g. {{'acc': acc}}), a loss tensor, or None from {method}.")
    return metrics, batch_size_of(batch) if count is None else count


def evaluate_metrics(
    model: nn.Module,
    loader: DataLoader,
    step: StepFn,
    plan: PrecisionPlan,
    collector: MetricCollector,
    *,
    max_batches: int | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    reduce_sum: Callable[[Any], torch.Tensor] | None = None,
    union: Callable[[list[str]], list[str]] | None = None,
    method: str = "validation_step",
) -> dict[str, float] | None:
    """Every metric the step returns or logs, averaged over the loader (up to
    ``max_batches``); None if stopped early, {} when the loader is empty.

    Leaves the model in the mode it found it in.
    """
    was_training = model.training
    model.eval()
    collector.start_eval()
    try:
        with torch.no_grad():
            for index, batch in enumerate(loader):
                if max_batches is not None and index >= max_batches:
                    break
                if should_stop():
                    return None
                batch = move_to_device(batch, plan.device, non_blocking=plan.device.type == "cuda")
                collector.set_batch_weight(batch_size_of(batch))
                with plan.autocast():
                    metrics, weight = step_metrics(step(model, batch), batch, method)
                collector.set_batch_weight(weight)
                for name, value in metrics.items():
                    collector.log(name, value)
    finally:
        model.train(was_training)
        collector.mode = "off"
    return collector.end_eval(reduce_sum, union)
