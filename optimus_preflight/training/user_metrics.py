"""A recipe's own metrics: ``self.log(name, value)`` from ``compute_loss`` or
``validation_step``, the way Lightning's ``LightningModule.log`` works.

Values stay where they are (tensors on the device) until a logged step or the end of an
evaluation reads them, in one transfer: logging a metric adds no host sync per step.
Training values are the mean over the current step's micro-batches; evaluation values
are the mean over the whole validation set, weighted by each batch's size (or the count
``validation_step`` returns).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

import torch

OFF, TRAIN, EVAL = "off", "train", "eval"


def _as_value(name: str, value: Any) -> torch.Tensor | float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"self.log({name!r}, ...) takes a number or a one-element tensor, got shape {tuple(value.shape)}")
        return value.detach().reshape(()).double()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"self.log({name!r}, ...) takes a number or a one-element tensor, got {type(value).__name__}")


def _to_floats(values: dict[str, Any], reduce_mean: Callable[[torch.Tensor], torch.Tensor] | None) -> dict[str, float]:
    """One transfer for every tensor (and one collective under DDP)."""
    if not values:
        return {}
    names = sorted(values)
    device = next((v.device for v in values.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
    stacked = torch.stack([v.to(device) if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.float64, device=device)
                           for v in (values[n] for n in names)])
    if reduce_mean is not None:
        stacked = reduce_mean(stacked)
    return dict(zip(names, stacked.tolist()))


class MetricCollector:
    """Collects ``self.log`` calls; ignored outside a training step or an evaluation
    (the preflight runs ``compute_loss`` too, and must not leave values behind)."""

    def __init__(self) -> None:
        self.mode = OFF
        self.progress_bar: set[str] = set()
        self._step_sums: dict[str, Any] = {}
        self._step_counts: dict[str, int] = {}
        self._eval_sums: dict[str, Any] = {}
        self._eval_weights: dict[str, Any] = {}
        self._weight: Any = 1.0

    def log(self, name: str, value: Any, *, prog_bar: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"self.log takes a metric name first, got {name!r}")
        if self.mode == OFF:
            return
        value = _as_value(name, value)
        if prog_bar:
            self.progress_bar.add(name)
        if self.mode == TRAIN:
            self._step_sums[name] = self._step_sums.get(name, 0.0) + value
            self._step_counts[name] = self._step_counts.get(name, 0) + 1
        else:
            weight = self._weight
            self._eval_sums[name] = self._eval_sums.get(name, 0.0) + value * weight
            self._eval_weights[name] = self._eval_weights.get(name, 0.0) + weight

    # ------------------------------------------------------------------ training
    def start_step(self) -> None:
        self.mode = TRAIN
        self._step_sums.clear()
        self._step_counts.clear()

    def end_step(self) -> None:
        self.mode = OFF

    def step_values(self, reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    union: Callable[[list[str]], list[str]] | None = None) -> dict[str, float]:
        """The last step's metrics (mean over its micro-batches), read from the device.
        Under DDP (``reduce_sum``, ``union``): the mean over the ranks that logged each."""
        values = {n: s / self._step_counts[n] for n, s in self._step_sums.items()}
        if reduce_sum is None:
            return _to_floats(values, None)
        names = union(list(values)) if union is not None else sorted(values)
        sums = _to_floats({n: values.get(n, 0.0) for n in names}, reduce_sum)
        ranks = _to_floats({n: float(n in values) for n in names}, reduce_sum)
        return {n: sums[n] / ranks[n] for n in names}

    # ---------------------------------------------------------------- evaluation
    def start_eval(self) -> None:
        self.mode = EVAL
        self._eval_sums.clear()
        self._eval_weights.clear()

    def set_batch_weight(self, weight: Any) -> None:
        self._weight = weight.detach().double() if isinstance(weight, torch.Tensor) else float(weight)

    def end_eval(self, reduce_sum: Callable[[Any], torch.Tensor] | None = None,
                 union: Callable[[list[str]], list[str]] | None = None) -> dict[str, float]:
        """The evaluation's metrics, each weighted over every batch (and rank) that logged
        it. ``union``: every rank's names, so a rank whose shard had no batch still joins."""
        self.mode = OFF
        names = sorted(self._eval_sums) if union is None else union(sorted(self._eval_sums))
        if not names:
            return {}
        sums = _to_floats({n: self._eval_sums.get(n, 0.0) for n in names}, reduce_sum)
        weights = _to_floats({n: self._eval_weights.get(n, 0.0) for n in names}, reduce_sum)
        return {n: (sums[n] / weights[n] if weights[n] else math.nan) for n in names}


def prefixed(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """``{"acc": .9}`` -> ``{"val_acc": .9}``; a name that already has the prefix keeps it."""
    return {(name if name.startswith(prefix) else prefix + name): value for name, value in metrics.items()}
