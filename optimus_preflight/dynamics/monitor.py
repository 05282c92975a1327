"""The dynamics component of the training loop: arms, measures, disarms.

Every ``every_n_steps`` steps it measures one optimizer step: forward hooks on the
activation modules for that step's forward (dead fractions, activation samples), a
copy of the weights just before ``optimizer.step()`` (``before_optimizer_step``, which
``DynamicsCallback`` calls at that event) for the update/weight ratio, the GradScaler scale
and the skip rate since the last measurement; with TensorBoard on, histograms of
weights, gradients and activations. Between measurements nothing is attached and
nothing is read back from the device. A Watchdog turns the values into warnings.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.dynamics.hooks import ActivationProbe
from optimus_preflight.dynamics.measures import activation_modules, skip_rate, snapshot_groups, update_ratios
from optimus_preflight.dynamics.watchdog import Watchdog, default_rules
from optimus_preflight.training.distributed import unwrap
from optimus_preflight.training.optim import group_names
from optimus_preflight.training.step import StepResult

log = logging.getLogger("optimus_preflight")


class HistogramWriter(Protocol):
    def histogram(self, tag: str, values: torch.Tensor, step: int) -> None: ...


class DynamicsMonitor:
    def __init__(
        self,
        model: nn.Module,
        optimizer: Optimizer,
        scaler: torch.amp.GradScaler,
        *,
        every_n_steps: int,
        group_names: list[str],
        start_step: int = 0,
        start_skipped: int = 0,
        max_steps: int | None = None,
        precision: str = "fp32",
        histograms: HistogramWriter | None = None,
        watchdog: Watchdog | None = None,
        log_warnings: bool = True,
    ):
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.every_n_steps = every_n_steps
        self.group_names = group_names
        self.max_steps = max_steps
        self.histograms = histograms
        # Under DDP every rank measures (the same numbers); one rank speaks.
        self.log_warnings = log_warnings
        self.watchdog = watchdog or Watchdog(default_rules(precision))
        self._modules = activation_modules(model)
        self._param_names = {id(p): name for name, p in unwrap(model).named_parameters()}
        self._last = (start_step, start_skipped)
        self._armed_step: int | None = None
        self._probe: ActivationProbe | None = None
        self._snapshot: list[list[torch.Tensor]] | None = None
        self.prepare(start_step + 1)

    def measures(self, step: int) -> bool:
        return self._armed_step == step

    def prepare(self, step: int) -> None:
        """Arm the hooks when ``step`` (the next optimizer step) is a dynamics step."""
        if self._armed_step is not None and self._armed_step < step:
            self.close()  # armed for a step that was never reported: do not stay attached
        if self._armed_step is not None or step % self.every_n_steps:
            return
        if self.max_steps is not None and step > self.max_steps:
            return
        self._armed_step = step
        self._probe = ActivationProbe(self._modules, keep_samples=self.histograms is not None)

    def before_optimizer_step(self, step: int) -> None:
        """The final gradients exist (unscaled, clipped): snapshot the weights of an armed step."""
        if self._armed_step != step:
            return
        self._snapshot = snapshot_groups(self.optimizer)
        if self.histograms is not None and self._armed_step is not None:
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self.histograms.histogram(f"grads/{self._name(p)}", p.grad, self._armed_step)

    def on_logged_step(self, step: int, result: StepResult, skipped_steps: int, loss: float) -> dict[str, Any]:
        """Extra keys for the step's metrics record: the measurements when the step was
        armed, and ``warnings`` when the watchdog opened an episode."""
        metrics = self._measure(step, result, skipped_steps) if self.measures(step) else {}
        warnings = self.watchdog.observe(step, {"loss": loss, **metrics})
        for warning in warnings if self.log_warnings else ():
            log.warning(warning.line())
        self.prepare(step + 1)
        if warnings:
            metrics["warnings"] = [warning.to_dict() for warning in warnings]
        return metrics

    def _measure(self, step: int, result: StepResult, skipped_steps: int) -> dict[str, Any]:
        probe, snapshot = self._probe, self._snapshot
        self.close()
        metrics: dict[str, Any] = {}
        if snapshot is not None and result.stepped:
            ratios = update_ratios(self.optimizer, snapshot, self.group_names)
            metrics.update({f"update_ratio/{name}": value for name, value in ratios.items()})
        if probe is not None:
            metrics.update({f"dead_fraction/{name}": value for name, value in probe.dead_fractions().items()})
        if self.scaler.is_enabled():
            metrics["grad_scale"] = self.scaler.get_scale()
        metrics["skip_rate"] = skip_rate(skipped_steps, self._last[1], step, self._last[0])
        self._last = (step, skipped_steps)
        if self.histograms is not None:
            self._write_histograms(step, probe)
        return metrics

    def _write_histograms(self, step: int, probe: ActivationProbe | None) -> None:
        for name, p in unwrap(self.model).named_parameters():
            self.histograms.histogram(f"weights/{name}", p.detach(), step)
        for name, sample in (probe.samples if probe is not None else {}).items():
            self.histograms.histogram(f"activations/{name}", sample, step)

    def _name(self, param: torch.Tensor) -> str:
        return self._param_names.get(id(param), f"param{id(param)}")

    def close(self) -> None:
        """Detach everything; safe to call twice, and when nothing is armed."""
        if self._probe is not None:
            self._probe.remove()
        self._probe = self._snapshot = None
        self._armed_step = None


def monitor_for_recipe(recipe: Any, sinks: list[Any]) -> DynamicsMonitor | None:
    """The recipe's monitor, or None when ``logging.dynamics_every_n_steps=0``.
    Histograms go to the TensorBoard sink when there is one."""
    every = recipe.cfg.logging.dynamics_every_n_steps
    if not every:
        return None
    context = recipe.training_context
    return DynamicsMonitor(
        recipe.model,
        recipe.optimizer,
        context.scaler,
        every_n_steps=every,
        group_names=group_names(recipe.optimizer),
        start_step=recipe.state.step,
        start_skipped=recipe.state.skipped_steps,
        max_steps=recipe.cfg.trainer.max_steps,
        precision=context.precision,
        histograms=next((sink for sink in sinks if hasattr(sink, "histogram")), None),
        log_warnings=context.dist.is_main,
    )
