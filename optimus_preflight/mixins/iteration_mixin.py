from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any, Callable, NamedTuple

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.checkpoint.signals import StopRequested
from optimus_preflight.mixins.options import TrainerSettings, trainer_options
from optimus_preflight.training.distributed import DistEnv
from optimus_preflight.training.gradients import clip_grads_, params_with_grads, total_norm
from optimus_preflight.training.precision import make_grad_scaler
from optimus_preflight.training.step import (
    StepResult,
    StepRunner,
    accumulation_context,
    runner_from_config,
    split_loss_output,
)
from optimus_preflight.training.stream import BatchStream
from optimus_preflight.training.training_context import TrainingContext, resolve_plan

log = logging.getLogger("optimus_preflight")


class ForwardPassResult(NamedTuple):
    loss: torch.Tensor
    exposed_protocols: dict[str, Any]
    elapsed_time: float  # ms


class OptimizerStepResult(NamedTuple):
    elapsed_time: float  # ms
    grad_norm: torch.Tensor | None


class TrainingIterationMixin:
    """One optimizer step per accumulation window, with grad norm and LR logging.

    ``TrainingIterationMixin(optimization_config, log_freq=1)``; then, per step,
    ``run_training_iteration(model, optimizer, criterion, train_data_iter,
    training_context, lr_scheduler=None, metric_engine=None)``. ``criterion(model, batch)``
    returns the mean loss, or ``(loss, count)`` with the number of targets it averages
    (micro-batches are weighted by it, so accumulation equals the full batch), or
    ``(loss, dict)`` as optimus_dl's criteria do. ``train_data_iter`` is best
    ``self.training_batches(loader)``: its windows never cross an epoch, it restarts the
    loader each epoch, and its position is what a checkpoint resumes from; any iterator
    of batches also works. Every ``log_freq`` steps the step's values (loss, grad norm,
    LRs, phase times, memory) are read from the device into ``self.training_metrics``
    and logged; other steps never wait for the device.
    """

    optimization_config: TrainerSettings
    training_metrics: dict[str, float]

    def __init__(self, optimization_config: Any = None, log_freq: int = 1):
        self.optimization_config = trainer_options(optimization_config)
        self.log_freq = log_freq
        self.training_metrics = {}
        self._iterations = 0
        self._runner: tuple[tuple[Any, ...], StepRunner] | None = None

    # ---------------------------------------------------------------- the step
    def training_batches(self, loader: Iterable[Any]) -> BatchStream:
        """Accumulation windows over ``loader``, epoch after epoch, with a resumable position."""
        return BatchStream(loader, self.optimization_config.accumulation_steps)

    def step_runner(self, model: nn.Module, optimizer: Optimizer, criterion: Callable[..., Any],
                    training_context: TrainingContext, lr_scheduler: Any = None) -> StepRunner:
        """The component that runs the step (kept while the objects stay the same): hooks
        such as ``optimizer_step_hooks`` are added to it."""
        key = (model, optimizer, criterion, training_context, lr_scheduler)
        # ``==`` for the criterion: ``self.compute_loss`` is a new bound method at each access.
        if self._runner is not None and all(a is b or (callable(a) and a == b) for a, b in zip(self._runner[0], key)):
            return self._runner[1]
        runner = runner_from_config(self.optimization_config, training_context, model, optimizer,
                                    _CriterionAdapter(criterion), scheduler=lr_scheduler)
        runner.accumulation_context = self.accumulation_context
        self._runner = (key, runner)
        return runner

    def run_training_iteration(
        self,
        model: nn.Module,
        optimizer: Optimizer,
        criterion: Callable[..., Any],
        train_data_iter: Iterator[Any] | BatchStream,
        training_context: TrainingContext | None = None,
        lr_scheduler: Any = None,
        metric_engine: Any = None,
    ) -> StepResult | None:
        """One optimizer step; None when a stop request abandoned the window (its partial
        gradients are dropped and the data position stays at the last completed step).
        A plain iterator that has no batch left raises StopIteration. ``training_context``:
        ``setup_training_context``'s; None: the settings' precision on the model's device."""
        training_context = training_context if training_context is not None else self._own_context(model)
        runner = self.step_runner(model, optimizer, criterion, training_context, lr_scheduler)
        stream = train_data_iter if isinstance(train_data_iter, BatchStream) else None
        runner.should_stop = stream.should_stop if stream is not None else (lambda: False)
        window = stream.window() if stream is not None else None
        if window is None:
            window = _plain_window(_first(train_data_iter), train_data_iter, runner.accumulation_steps)
        try:
            result = runner.run(window)
        except StopRequested:  # a stop signal ended a wait for data
            result = None
        if result is None:
            optimizer.zero_grad(set_to_none=True)
            return None
        if stream is not None:
            stream.commit()
        self._iterations += 1
        if self.log_freq and self._iterations % self.log_freq == 0:
            self._log_step(result, optimizer, lr_scheduler, metric_engine, model)
        return result

    def _own_context(self, model: nn.Module) -> TrainingContext:
        """Without a training context (no TrainingContextMixin): the settings' precision
        on the model's device, seeding nothing."""
        cached = getattr(self, "_default_context", None)
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        if cached is None or cached.device != device:
            settings = self.optimization_config
            plan = resolve_plan(settings, device)
            cached = TrainingContext(device, plan, make_grad_scaler(plan, settings.grad_scaler), DistEnv.from_environment())
            self._default_context = cached
        return cached

    def accumulation_context(self, model: nn.Module, is_last_microbatch: bool) -> contextlib.AbstractContextManager:
        """Around each micro-batch: DDP skips its all-reduce on all but the window's last."""
        return accumulation_context(model, is_last_microbatch)

    # ------------------------------------------------------- the step in parts
    def execute_forward_pass(self, model: nn.Module, criterion: Callable[..., Any], batch: Any, amp_ctx: Any,
                             requested_protocols: set[str] | None = None) -> ForwardPassResult:
        """``criterion(model, batch)`` under ``amp_ctx``; the loss, what the criterion
        exposed (a dict it returned, or ``{"count": n}``) and the time in ms."""
        started = time.perf_counter()
        with amp_ctx:
            output = criterion(model, batch)
        exposed = output[1] if isinstance(output, tuple) and isinstance(output[1], dict) else {}
        loss, count = split_loss_output(output[0] if exposed else output, batch)
        return ForwardPassResult(loss, exposed or {"count": count}, (time.perf_counter() - started) * 1e3)

    def execute_backward_pass(self, loss: torch.Tensor, scaler: torch.amp.GradScaler) -> float:
        """The scaled backward; its time in ms."""
        started = time.perf_counter()
        scaler.scale(loss).backward()
        return (time.perf_counter() - started) * 1e3

    def execute_optimizer_step(self, optimizer: Optimizer, model: nn.Module, scaler: torch.amp.GradScaler,
                               clip_grad_norm: float | None = None) -> OptimizerStepResult:
        """Unscale, measure (and clip) the total gradient norm, step unless it is
        non-finite (the scaler's rule under fp16), update the scaler."""
        started = time.perf_counter()
        scaler.unscale_(optimizer)
        params = params_with_grads(optimizer)
        grad_norm = total_norm(params)
        if clip_grad_norm is not None:
            clip_grads_(params, clip_grad_norm, grad_norm)
        if scaler.is_enabled():
            scaler.step(optimizer)
            scaler.update()
        elif bool(torch.isfinite(grad_norm)):
            optimizer.step()
        return OptimizerStepResult((time.perf_counter() - started) * 1e3, grad_norm)

    # ----------------------------------------------------------------- logging
    def log_batch_metrics(self, elapsed_batch_get: float, elapsed_forward: float, elapsed_backward: float,
                          acc_steps: int) -> None:
        """Per-micro-batch means of the phase times, in ms."""
        self.training_metrics.update({"perf/batch_get_ms": elapsed_batch_get / acc_steps,
                                      "perf/forward_ms": elapsed_forward / acc_steps,
                                      "perf/backward_ms": elapsed_backward / acc_steps})

    def log_optimizer_metrics(self, elapsed_optimizer: float, grad_norm: torch.Tensor | None, lr_scheduler: Any,
                              optimizer: Optimizer) -> None:
        self.training_metrics["perf/optimizer_ms"] = elapsed_optimizer
        if grad_norm is not None:
            self.training_metrics["grad_norm"] = float(grad_norm)
        lrs = lr_scheduler.get_last_lr() if lr_scheduler is not None else [g["lr"] for g in optimizer.param_groups]
        self.training_metrics["learning_rate"] = float(lrs[0])
        for index, lr in enumerate(lrs[1:], start=1):
            self.training_metrics[f"learning_rate/group{index}"] = float(lr)

    def log_memory_usage(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.training_metrics["gpu_gb_allocated"] = torch.cuda.memory_allocated() / 2**30
            self.training_metrics["gpu_gb_peak"] = torch.cuda.max_memory_allocated() / 2**30

    def _log_step(self, result: StepResult, optimizer: Optimizer, lr_scheduler: Any, metric_engine: Any,
                  model: nn.Module) -> None:
        times = result.times
        self.training_metrics["loss"] = float(result.loss)
        self.log_batch_metrics(times.data_s * 1e3, times.forward_s * 1e3, times.backward_s * 1e3, result.micro_batches)
        self.log_optimizer_metrics(times.optimizer_s * 1e3, result.grad_norm, lr_scheduler, optimizer)
        self.log_memory_usage()
        if metric_engine is not None:
            metric_engine.update(data={"model": model}, computed_data={"loss": result.loss, "grad_norm": result.grad_norm})
        log.info("iteration %d | loss %.4f | grad_norm %.3g | lr %.3g%s", self._iterations, self.training_metrics["loss"],
                 self.training_metrics["grad_norm"], self.training_metrics["learning_rate"],
                 "" if result.stepped else " | skipped (non-finite gradients)")


class _CriterionAdapter:
    """A criterion that drops an exposed-protocols dict; equal to another wrapping the
    same criterion, so the step runner is reused across steps."""

    def __init__(self, criterion: Callable[..., Any]):
        self.criterion = criterion

    def __call__(self, model: nn.Module, batch: Any) -> Any:
        output = self.criterion(model, batch)
        return output[0] if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], dict) else output

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _CriterionAdapter) and other.criterion == self.criterion

    __hash__ = None  # type: ignore[assignment]


def _first(batches: Any) -> Any:
    """The window's first batch; StopIteration when the iterator is done."""
    if not isinstance(batches, Iterator):
        raise TypeError(f"train_data_iter must be an iterator (each step takes the next batches), got {type(batches).__name__}: "
                        "pass self.training_batches(loader) (epochs, resumable) or iter(loader)")
    return next(batches)


def _plain_window(pending: Any, batches: Iterator[Any], accumulation_steps: int) -> Iterator[tuple[Any, bool]]:
    """``(batch, is_last)`` for up to ``accumulation_steps`` batches of a plain iterator;
    the next batch is read ahead so ``is_last`` is known before the backward."""
    for index in itertools.count(1):
        upcoming = next(batches, _END) if index < accumulation_steps else _END
        yield pending, upcoming is _END
        if upcoming is _END:
            return
        pending = upcoming


_END = object()
