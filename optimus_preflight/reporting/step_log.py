"""Turns StepResults into metric records on logged steps only.

Between logged steps nothing is read back from the device: the results' tensors
are only converted (one host sync) when a record is built.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from optimus_preflight.reporting.progress import Progress
from optimus_preflight.reporting.sinks import MetricsLogger, lr_metrics, memory_metrics
from optimus_preflight.training.step import PhaseTimes, StepResult


class StepLogger:
    def __init__(
        self,
        metrics: MetricsLogger,
        progress: Progress,
        *,
        every_n_steps: int,
        device: torch.device,
        scaler: torch.amp.GradScaler,
        group_names: list[str],
        world_size: int = 1,
        reduce_sum: Callable[[Any], torch.Tensor] | None = None,
        union_names: Callable[[list[str]], list[str]] | None = None,
        wants_record: Callable[[int], bool] = lambda step: False,
        extend_record: Callable[[int, StepResult, dict[str, Any]], None] = lambda step, result, record: None,
    ):
        self.metrics = metrics
        self.progress = progress
        self.every_n_steps = every_n_steps
        self.device = device
        self.scaler = scaler
        self.group_names = group_names
        self.world_size = world_size
        # Under DDP every rank builds the record (the loss is a collective); only the
        # main rank has sinks.
        self.reduce_sum = reduce_sum
        self.union_names = union_names  # under DDP: every rank's metric names (training/distributed.py)
        # The callbacks' part of the record (optimus_preflight.callbacks): steps they need
        # logged (a dynamics measurement, a compile warm-up), and the keys they add.
        self.wants_record = wants_record
        self.extend_record = extend_record
        self._reset()

    def _reset(self) -> None:
        self._times = PhaseTimes()
        self._steps = 0
        self._samples = 0
        self._since = time.perf_counter()

    def on_step(self, step: int, result: StepResult, skipped_steps: int, *, force: bool = False,
                epoch: int | None = None, user_metrics: Any = None) -> dict[str, Any] | None:
        """``user_metrics``: the recipe's MetricCollector, read (one transfer) on logged
        steps only."""
        self._steps += 1
        self._samples += result.samples
        for name in ("data_s", "forward_s", "backward_s", "optimizer_s"):
            setattr(self._times, name, getattr(self._times, name) + getattr(result.times, name))
        self.progress.advance()
        # Step 1 is always logged: the loss at initialisation is the first thing to check.
        if not force and step != 1 and step % self.every_n_steps and not self.wants_record(step):
            return None
        loss_tensor = result.loss
        if self.reduce_sum is not None:  # the global mean over every rank's targets
            loss_tensor = self.reduce_sum(result.loss.detach().double() * result.count) / self.reduce_sum(result.count)
        loss = loss_tensor.item()
        record: dict[str, Any] = {
            "step": step,
            **({"epoch": epoch} if epoch is not None else {}),
            "loss": loss,
            **lr_metrics(result.lrs, self.group_names),
            "grad_norm": result.grad_norm.item(),
            "skipped_steps": skipped_steps,
        }
        if self.scaler.is_enabled():
            record["grad_scale"] = self.scaler.get_scale()
        if user_metrics is not None:
            for name, value in user_metrics.step_values(self.reduce_sum, self.union_names).items():
                record.setdefault(name, value)  # a metric named like a built-in one does not replace it
            self.progress.show(user_metrics.progress_bar)
        elapsed = time.perf_counter() - self._since  # after .item(): the device is in sync
        record["samples_per_s"] = self._samples * self.world_size / max(elapsed, 1e-9)
        self.extend_record(step, result, record)
        for name, key in (("data_s", "data"), ("forward_s", "forward"), ("backward_s", "backward"), ("optimizer_s", "optimizer")):
            record[f"time/{key}_ms"] = 1000.0 * getattr(self._times, name) / self._steps
        record.update(memory_metrics(self.device))
        self.metrics.log(record)
        self.progress.report(record)
        self._reset()
        return record

    def close(self) -> None:
        self.progress.close()
        self.metrics.close()

    def on_eval(self, step: int, metrics: dict[str, float], *, epoch: int | None = None) -> None:
        """An evaluation's record (``val_*``, or ``test_*`` for the test loader)."""
        self.metrics.log({"step": step, **({"epoch": epoch} if epoch is not None else {}), **metrics})
        self.progress.write(f"step {step} | " + " | ".join(f"{name} {value:.4f}" for name, value in metrics.items()))
