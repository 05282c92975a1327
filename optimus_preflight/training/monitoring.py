"""Watching an evaluation metric: the best checkpoint (checkpoint.monitor) and early
stopping (trainer.early_stopping). Their state travels in the run state, so a resumed
run keeps its best-so-far and its patience count."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from optimus_preflight.errors import UserError


@dataclass
class MetricMonitor:
    metric: str
    mode: str = "min"  # min: lower is better
    min_delta: float = 0.0
    best: float | None = None
    best_step: int | None = None
    evals_without_improvement: int = 0

    def improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, metrics: dict[str, float], step: int) -> bool:
        """Record an evaluation that has the metric; True when it is the best so far."""
        value = float(metrics[self.metric])
        if self.improves(value):
            self.best, self.best_step, self.evals_without_improvement = value, step, 0
            return True
        self.evals_without_improvement += 1
        return False

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # The metric, mode and min_delta come from this run's config; the history from the checkpoint.
        if state.get("metric") == self.metric and state.get("mode") == self.mode:
            self.best = None if state.get("best") is None else float(state["best"])
            self.best_step = None if state.get("best_step") is None else int(state["best_step"])
            self.evals_without_improvement = int(state.get("evals_without_improvement", 0))


def monitor_error(key: str, metric: str, metrics: dict[str, float]) -> UserError:
    available = ", ".join(sorted(metrics)) or "none: the validation loader is empty or missing"
    return UserError(
        f"{key}={metric!r} is not a metric the evaluation produces (it produced: {available})",
        key=key,
        fix=f"Set {key} to one of those: val_loss, or val_<name> for a metric validation_step returns or logs.",
    )

