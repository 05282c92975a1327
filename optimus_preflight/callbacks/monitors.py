"""The toolkit's own callbacks on an evaluation metric: the best checkpoint
(checkpoint.monitor) and early stopping (trainer.early_stopping). Their best-so-far and
patience are callback state, so every checkpoint carries them."""

from __future__ import annotations

from typing import Any

from optimus_preflight.callbacks import Callback
from optimus_preflight.training.monitoring import MetricMonitor, monitor_error


def _validation(metrics: dict[str, float]) -> bool:
    return any(name.startswith("val_") for name in metrics)  # the test's test_* are not watched


class _Watching(Callback):
    key = ""

    def __init__(self, monitor: MetricMonitor):
        self.monitor = monitor

    def on_fit_start(self, recipe: Any) -> None:
        # A typo is found before the first step, not at the first evaluation.
        names = recipe.validation_metric_names(self.key)
        if names is not None and self.monitor.metric not in names:
            raise monitor_error(self.key, self.monitor.metric, dict.fromkeys(names, 0.0))

    def observe(self, step: int, metrics: dict[str, float]) -> bool | None:
        """True for a new best, False otherwise; None for an evaluation it does not watch."""
        if not _validation(metrics):
            return None
        if self.monitor.metric not in metrics:
            raise monitor_error(self.key, self.monitor.metric, metrics)
        return self.monitor.update(metrics, step)

    def state_dict(self) -> dict[str, Any]:
        return self.monitor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.monitor.load_state_dict(state)


class BestCheckpoint(_Watching):
    """At each new best: this step's checkpoint, linked as checkpoints/best."""

    key = state_key = "checkpoint.monitor"

    def __init__(self, metric: str, mode: str = "min"):
        super().__init__(MetricMonitor(metric, mode))

    def on_eval_end(self, recipe: Any, step: int, metrics: dict[str, float]) -> None:
        if self.observe(step, metrics):
            recipe.keep_best(self.monitor)


class EarlyStopping(_Watching):
    """Ends training after ``patience`` evaluations without an improvement of more than
    ``min_delta``; the reason goes to summary.json."""

    key = state_key = "trainer.early_stopping.monitor"

    def __init__(self, metric: str, mode: str = "min", patience: int = 3, min_delta: float = 0.0):
        super().__init__(MetricMonitor(metric, mode, min_delta))
        self.patience = patience

    def on_eval_end(self, recipe: Any, step: int, metrics: dict[str, float]) -> None:
        if self.observe(step, metrics) is False and self.monitor.evals_without_improvement >= self.patience:
            monitor = self.monitor
            recipe.state.stop_reason = recipe.state.stop_reason or (
                f"early stopping: {monitor.metric} did not improve by more than {monitor.min_delta:g} in "
                f"{self.patience} evaluation(s); best {monitor.best:.6g} at step {monitor.best_step}")
