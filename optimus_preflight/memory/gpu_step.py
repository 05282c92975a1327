"""A real synthetic training step on the GPU, next to the fake-tensor prediction.

``check_gpu_step`` runs two training steps of a batch (a real one, or a zero batch made by
a ``BatchMaker`` on the model's device) under the given precision, logs the peak VRAM
beside the prediction and restores everything it touched (weights, buffers, gradients,
optimizer and scaler state, RNG states). It calls the module inside a DDP wrapper, under
``no_sync``, so no collective is issued and the other ranks are not waited for. Every
skip is logged; an out-of-memory error is logged with the fix, and raised only on request.
``measure_gpu_step`` returns the measurement and the prediction as an object.

Why this module is long (~320 lines): the restore of everything a real step touches,
and the DDP/FSDP handling of the wrapped module, must sit next to the step they undo.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.checkpoint.training_snapshot import TrainingStateSnapshot
from optimus_preflight.memory.estimate import estimate_training_step
from optimus_preflight.memory.fake_copy import fake_copy_factory, optimizer_factory_like
from optimus_preflight.memory.result import MemoryEstimate, gib
from optimus_preflight.memory.steps import run_training_steps
from optimus_preflight.training.batches import move_to_device, tensors
from optimus_preflight.training.distributed import unwrap

log = logging.getLogger("optimus_preflight")


def default_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """Cross-entropy for ``(inputs, targets)`` batches, as ``TrainRecipe.compute_loss``."""
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=-100)


@dataclass
class GpuStepReport:
    # None when the fake-tensor prediction failed but the real step could still run.
    predicted: MemoryEstimate | None
    measured_peak_bytes: int | None = None
    device: str = "cpu"
    total_bytes: int | None = None  # the device's memory, when known

    @property
    def predicted_bytes(self) -> int | None:
        """Comparable with ``torch.cuda.max_memory_allocated``: allocator peak plus workspaces."""
        if self.predicted is None:
            return None
        return (self.predicted.allocator_peak_bytes or self.predicted.peak_bytes) + self.predicted.workspace_bytes

    @property
    def error(self) -> float | None:
        if not self.measured_peak_bytes or self.predicted_bytes is None:
            return None
        return (self.predicted_bytes - self.measured_peak_bytes) / self.measured_peak_bytes

    def describe(self) -> str:
        if self.measured_peak_bytes is None:
            prediction = self.predicted.describe() if self.predicted is not None else "nothing (the prediction failed)"
            return f"no CUDA device: predicted CPU-side {prediction}"
        share = f" ({self.measured_peak_bytes / self.total_bytes:.0%} of {gib(self.total_bytes)})" if self.total_bytes else ""
        measured = f"GPU step on {self.device}: measured peak {gib(self.measured_peak_bytes)}{share} (torch.cuda.max_memory_allocated)"
        if self.predicted is None:
            return f"{measured}; no prediction (the fake-tensor trace failed)"
        return f"{measured}, predicted {gib(self.predicted_bytes)} ({self.error:+.1%}); {self.predicted.describe()}"


def _resolved(precision: str, device: torch.device) -> str:
    if precision != "auto":
        return precision
    from optimus_preflight.training.precision import resolve_precision

    return resolve_precision("auto", device)


def is_fsdp(model: nn.Module) -> bool:
    """An FSDP-wrapped model: its step needs every rank, so a one-rank check cannot run it."""
    return any(
        "FullyShardedDataParallel" in cls.__name__ or cls.__name__.startswith("FSDP") for cls in type(model).__mro__
    )


@contextlib.contextmanager
def restored_training_state(model: nn.Module, optimizer: Optimizer, scaler: Any = None):
    """Everything a synthetic step changes is put back on exit, even after an OOM."""
    snapshot = TrainingStateSnapshot(model, optimizer, scaler=scaler)
    try:
        yield
    finally:
        optimizer.zero_grad(set_to_none=True)
        snapshot.restore()


def _device_total_bytes(device: torch.device) -> int | None:
    try:
        return int(torch.cuda.get_device_properties(device).total_memory)
    except Exception:  # only for the "% of the device" in the log line
        return None


def measure_gpu_step(
    model: nn.Module,
    optimizer: Optimizer,
    batch: Any,
    loss_fn: Callable[[nn.Module, Any], Any] | None = None,
    *,
    precision: str = "fp32",
    accumulation_steps: int = 1,
    scaler: Any = None,
    meter: Any = None,
) -> GpuStepReport:
    """Predict (fake tensors) and, on CUDA (or with a ``meter``), measure two training
    steps of ``batch``. Where it measures, a failed prediction does not stop the
    measurement: the real step is the point. ``precision`` may be ``"auto"``."""
    loss_fn = loss_fn or default_loss
    module = unwrap(model)
    device = next(module.parameters()).device
    precision = _resolved(precision, device)
    measures = meter is not None or device.type == "cuda"
    try:
        predicted = estimate_training_step(
            fake_copy_factory(module),
            batch,
            loss_fn,
            optimizer_factory_like(optimizer, module),
            precision=precision,
            device="cuda" if device.type == "cuda" else "cpu",
            accumulation_steps=accumulation_steps,
        )
    except Exception as error:
        if not measures:
            raise
        log.debug("GPU step: no prediction (%s: %s)", type(error).__name__, error)
        predicted = None
    if not measures:
        return GpuStepReport(predicted)
    measured = run_synthetic_steps(
        model, optimizer, batch, loss_fn, precision=precision, accumulation_steps=accumulation_steps, scaler=scaler,
        meter=meter,
    )
    total = _device_total_bytes(device) if device.type == "cuda" else None
    return GpuStepReport(predicted, measured, str(device), total)


class CudaPeakMeter:
    """``torch.cuda.max_memory_allocated`` over the steps run inside it."""

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self) -> CudaPeakMeter:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.cuda.synchronize(self.device)

    def peak(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.device))


def _peak_meter(device: torch.device) -> CudaPeakMeter | None:
    """The meter for a model on ``device``; None where there is no VRAM to measure."""
    return CudaPeakMeter(device) if device.type == "cuda" else None


def run_synthetic_steps(
    model: nn.Module,
    optimizer: Optimizer,
    batch: Any,
    loss_fn: Callable[[nn.Module, Any], Any],
    *,
    precision: str,
    accumulation_steps: int = 1,
    scaler: Any = None,
    meter: Any = None,
) -> int:
    """Two real training steps of ``batch`` on the model's device; everything restored after.

    Calls the module inside a DDP wrapper under ``no_sync``: no collective is issued.
    Returns the meter's peak (``CudaPeakMeter`` on the model's device by default).
    """
    module = unwrap(model)
    device = next(module.parameters()).device
    meter = meter or CudaPeakMeter(device)
    on_device = move_to_device(batch, device)
    no_sync = model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()
    with restored_training_state(module, optimizer, scaler), no_sync:
        module.train()
        with meter:
            run_training_steps(
                module,
                optimizer,
                lambda: on_device,
                loss_fn,
                None,
                precision=precision,
                accumulation_steps=accumulation_steps,
                device_type=device.type,
                scaler=scaler if scaler is not None and scaler.is_enabled() else None,
            )
        return meter.peak()


def output_mean_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """A loss for a batch without targets: the mean of the model's output; the sum of
    the means of its floating tensors when it returns a structure."""
    output = model(batch)
    values = [t for t in tensors(output) if t.is_floating_point()]
    if not values:
        raise TypeError(f"the model returned no floating-point tensor ({type(output).__name__})")
    return torch.stack([value.float().mean() for value in values]).sum()


def _release_cached_memory() -> None:
    """Give the synthetic step's cached blocks back: training allocates its own, and an
    OOM's leftovers would otherwise stay reserved."""
    try:
        torch.cuda.empty_cache()
    except Exception:  # nothing to give back where CUDA never started
        pass


@runtime_checkable
class BatchMaker(Protocol):
    """Makes a batch on a device, e.g. zeros of the shape a config implies; on ``"meta"``
    for the prediction alone, which needs shapes only."""

    def make(self, device: torch.device | str) -> Any: ...

    def describe(self) -> str: ...


OOM_FIX = ("reduce data.batch_size, set trainer.precision=bf16 or use activation checkpointing; the "
           "memory.vram_headroom preflight check predicts the largest micro-batch that fits")


def check_gpu_step(
    model: nn.Module,
    optimizer: Optimizer,
    batch: Any | BatchMaker,
    loss_fn: Callable[[nn.Module, Any], Any] | None = None,
    *,
    precision: str = "fp32",
    accumulation_steps: int = 1,
    scaler: Any = None,
    raise_on_oom: bool = False,
    oom_fix: str = OOM_FIX,
    name: str = "GPU step check",
) -> GpuStepReport | None:
    """Run two synthetic training steps of ``batch`` and log the peak VRAM beside the
    prediction; everything the steps touched is restored, in every case.

    ``batch`` is a real batch or a ``BatchMaker`` (its batch is made on the model's
    device, and on ``"meta"`` where only the prediction runs). Log lines start with
    ``name``. Skips with one log line: an FSDP model (its step needs every rank), a model
    without parameters, and any exception of the synthetic pass (WARNING with the
    error). Without a CUDA device, or with the model not on one, the CPU-side prediction
    is logged instead. A CUDA out-of-memory error is logged as an ERROR with ``oom_fix``
    and, with ``raise_on_oom=True``, raised as RuntimeError after the state is restored:
    the synthetic step is only a proxy of the training step, so by default its OOM is
    the strongest warning, not a verdict. Returns the report, None after a skip or an OOM.
    """
    if is_fsdp(model):
        log.warning("%s: skipped for an FSDP model (its step needs every rank)", name)
        return None
    maker = batch if isinstance(batch, BatchMaker) else None
    spec_text = f" on a {maker.describe()}" if maker is not None else ""
    input_text = f"; input: {maker.describe()}" if maker is not None else ""
    try:
        device = next(unwrap(model).parameters()).device
    except Exception as error:  # a model without parameters has no step to measure
        log.warning("%s: skipped: the model has no parameters (%s)", name, error)
        return None
    step = dict(precision=precision, accumulation_steps=accumulation_steps, scaler=scaler)
    meter = _peak_meter(device) if torch.cuda.is_available() else None
    if meter is None:
        where = "no CUDA device" if not torch.cuda.is_available() else f"the model is on {device}, not on a CUDA device"
        try:
            # Meta tensors: the prediction needs shapes only, so no zero batch is allocated.
            example = maker.make("meta") if maker is not None else batch
            report = measure_gpu_step(model, optimizer, example, loss_fn, **step)
        except Exception as error:
            log.info("%s: skipped: %s, and the CPU-side prediction failed (%s: %s)",
                     name, where, type(error).__name__, error)
            return None
        log.info("%s: %s: predicted CPU-side %s%s", name, where, report.predicted.describe(), input_text)
        return report
    try:
        example = maker.make(device) if maker is not None else batch
        report = measure_gpu_step(model, optimizer, example, loss_fn, meter=meter, **step)
    except torch.cuda.OutOfMemoryError as error:
        error.__traceback__ = None  # its frames hold the step's tensors, which empty_cache must get back
        example = None
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        message = f"{name}: the synthetic training step{spec_text} ran out of GPU memory ({first_line}). Fix: {oom_fix}."
        _release_cached_memory()
        log.error(message)
        if raise_on_oom:
            raise RuntimeError(message) from None
        return None
    except Exception as error:
        example = None
        _release_cached_memory()
        log.warning("%s: skipped: the synthetic pass%s failed (%s: %s); pass batch= and "
                    "loss_fn= if the model takes another input", name, spec_text, type(error).__name__, error)
        return None
    example = None
    _release_cached_memory()
    log.info("%s: %s%s", name, report.describe(), input_text)
    return report
