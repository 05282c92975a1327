"""The dynamics monitor (logging.dynamics_every_n_steps) on the loop's events."""

from __future__ import annotations

from typing import Any

from optimus_preflight.callbacks import Callback
from optimus_preflight.dynamics.monitor import DynamicsMonitor, monitor_for_recipe


class DynamicsCallback(Callback):
    """Every ``logging.dynamics_every_n_steps`` steps: update/weight ratios per group,
    dead activations, the skip rate and histograms, and the watchdog's warnings on each
    logged step. Its hooks are attached only for the steps it measures."""

    def __init__(self) -> None:
        self.monitor: DynamicsMonitor | None = None

    def on_fit_start(self, recipe: Any) -> None:
        self.monitor = monitor_for_recipe(recipe, recipe.metric_sinks)

    def before_optimizer_step(self, recipe: Any, step: int) -> None:
        if self.monitor is not None:
            self.monitor.before_optimizer_step(step)

    def wants_step_logged(self, recipe: Any, step: int) -> bool:
        return self.monitor is not None and self.monitor.measures(step)

    def on_step_record(self, recipe: Any, step: int, result: Any, record: dict[str, Any]) -> None:
        if self.monitor is not None:
            record.update(self.monitor.on_logged_step(step, result, record["skipped_steps"], record["loss"]))

    def on_step_end(self, recipe: Any, step: int, record: dict[str, Any] | None) -> None:
        if self.monitor is not None:
            self.monitor.prepare(step + 1)  # arms the hooks when the next step measures

    def on_fit_end(self, recipe: Any, summary: dict[str, Any]) -> None:
        self.close()

    def on_exception(self, recipe: Any, error: BaseException) -> None:
        self.close()

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
