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


class MetricWatch:
    """The run's monitors by role: ``best`` (checkpoint.monitor) and ``early_stopping``
    (trainer.early_stopping), restored from and written back to the run state's
    ``monitors`` so every checkpoint carries them."""

    def __init__(self, checkpoint_cfg: Any, early_stopping_cfg: Any, saved: dict[str, dict[str, Any]]):
        self.monitors: dict[str, tuple[str, MetricMonitor]] = {}
        if checkpoint_cfg.monitor:
            self.monitors["best"] = ("checkpoint.monitor", MetricMonitor(checkpoint_cfg.monitor, checkpoint_cfg.mode))
        if early_stopping_cfg.monitor:
            self.monitors["early_stopping"] = ("trainer.early_stopping.monitor", MetricMonitor(
                early_stopping_cfg.monitor, early_stopping_cfg.mode, early_stopping_cfg.min_delta))
        self.patience = int(early_stopping_cfg.patience)
        for role, (_, monitor) in self.monitors.items():
            monitor.load_state_dict(saved.get(role, {}))

    def check_names(self, metrics: dict[str, float]) -> None:
        for key, monitor in self.monitors.values():
            if monitor.metric not in metrics:
                raise monitor_error(key, monitor.metric, metrics)

    def observe(self, metrics: dict[str, float], step: int, saved: dict[str, dict[str, Any]]) -> tuple[bool, str | None]:
        """Record an evaluation: (a new best checkpoint is due, why training stops or None)."""
        new_best, stop = False, None
        self.check_names(metrics)
        for role, (_, monitor) in self.monitors.items():
            improved = monitor.update(metrics, step)
            saved[role] = monitor.state_dict()
            new_best = new_best or (role == "best" and improved)
            if role == "early_stopping" and monitor.evals_without_improvement >= self.patience:
                stop = (f"early stopping: {monitor.metric} did not improve by more than {monitor.min_delta:g} in "
                        f"{self.patience} evaluation(s); best {monitor.best:.6g} at step {monitor.best_step}")
        return new_best, stop

    @property
    def best(self) -> MetricMonitor | None:
        entry = self.monitors.get("best")
        return entry[1] if entry else None
