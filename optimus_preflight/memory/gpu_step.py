"""``check_model_gpu_memory``: a real synthetic training step on the GPU, next to the prediction.

CREDIT's function of the same name runs a forward/backward/optimizer step on a zero
batch shaped from the config and logs the peak VRAM, leaving the weights changed. This
one keeps that contract (four arguments suffice: the zero batch is inferred from the
config, CREDIT's layout or ours) and runs two steps under the configured autocast,
then restores everything it touched (weights, buffers, gradients, optimizer and scaler
state, RNG states). It calls the module inside a DDP wrapper, under ``no_sync``, so no
collective is issued and the other ranks are not waited for. Every skip is logged.

Extensions: ``batch=`` a real training batch instead of the zero one, ``loss_fn=``,
``scaler=``, ``raise_on_oom=``; ``gpu_step_report`` returns the measurement and the
fake-tensor prediction as an object.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.checkpoint.training_snapshot import TrainingStateSnapshot
from optimus_preflight.config.schema import PRECISIONS
from optimus_preflight.config.seed_layouts import as_int, conf_get, is_credit_layout, synthetic_input
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


def _config_value(conf: Any, dotted: str, default: Any) -> Any:
    """Best effort, like the rest of the seed API: a config of any shape gives the default."""
    value = conf_get(conf, dotted)
    return default if value is None else value


def _precision(conf: Any, device: torch.device) -> str:
    requested = str(_config_value(conf, "trainer.precision", "fp32"))
    if requested not in PRECISIONS:  # e.g. CREDIT's configs have no trainer.precision of this form
        log.debug("check_model_gpu_memory: trainer.precision=%r is not one of %s; using fp32", requested, PRECISIONS)
        return "fp32"
    if requested != "auto":
        return requested
    from optimus_preflight.training.precision import resolve_precision

    return resolve_precision("auto", device)


def _accumulation_steps(conf: Any) -> int:
    return as_int(_config_value(conf, "trainer.accumulation_steps", 1), minimum=1) or 1


def _is_fsdp(model: nn.Module) -> bool:
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


def gpu_step_report(
    conf: Any,
    model: nn.Module,
    optimizer: Optimizer,
    *,
    batch: Any,
    loss_fn: Callable[[nn.Module, Any], Any] | None = None,
    scaler: Any = None,
    meter: Any = None,
) -> GpuStepReport:
    """Predict (fake tensors) and, on CUDA (or with a ``meter``), measure two training
    steps of ``batch``. Where it measures, a failed prediction does not stop the
    measurement: the real step is what the seed contract promises."""
    loss_fn = loss_fn or default_loss
    module = unwrap(model)
    device = next(module.parameters()).device
    precision = _precision(conf, device)
    accumulation = _accumulation_steps(conf)
    measures = meter is not None or device.type == "cuda"
    try:
        predicted = estimate_training_step(
            fake_copy_factory(module),
            batch,
            loss_fn,
            optimizer_factory_like(optimizer, module),
            precision=precision,
            device="cuda" if device.type == "cuda" else "cpu",
            accumulation_steps=accumulation,
        )
    except Exception as error:
        if not measures:
            raise
        log.debug("check_model_gpu_memory: no prediction (%s: %s)", type(error).__name__, error)
        predicted = None
    if not measures:
        return GpuStepReport(predicted)
    measured = run_synthetic_steps(
        model, optimizer, batch, loss_fn, precision=precision, accumulation_steps=accumulation, scaler=scaler,
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
    """CREDIT's synthetic loss: the mean of the model's output (no targets needed); the
    sum of the means of its floating tensors when it returns a structure."""
    output = model(batch)
    values = [t for t in tensors(output) if t.is_floating_point()]
    if not values:
        raise TypeError(f"the model returned no floating-point tensor ({type(output).__name__})")
    return torch.stack([value.float().mean() for value in values]).sum()


def _release_cached_memory() -> None:
    """Give the synthetic step's cached blocks back, as CREDIT does: training allocates
    its own, and an OOM's leftovers would otherwise stay reserved."""
    try:
        torch.cuda.empty_cache()
    except Exception:  # nothing to give back where CUDA never started
        pass


def _oom_message(error: BaseException, spec_text: str, credit: bool) -> str:
    fix = ("reduce trainer.train_batch_size, train in bf16 mixed precision or use activation checkpointing" if credit
           else "reduce data.batch_size, set trainer.precision=bf16 or use activation checkpointing; the "
           "memory.vram_headroom preflight check predicts the largest micro-batch that fits")
    first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
    return f"check_model_gpu_memory: the synthetic training step{spec_text} ran out of GPU memory ({first_line}). Fix: {fix}."


def check_model_gpu_memory(
    conf: Any,
    model: nn.Module,
    optimizer: Optimizer,
    rank: int = 0,
    *,
    batch: Any = None,
    loss_fn: Callable[[nn.Module, Any], Any] | None = None,
    scaler: Any = None,
    raise_on_oom: bool = False,
) -> None:
    """Run a synthetic forward/backward/optimizer step and log peak VRAM.

    Seed contract (CREDIT): builds a zero-filled batch of the input shape the config
    implies, runs it through the model (the module inside a DDP wrapper), backpropagates,
    steps the optimizer and logs the peak VRAM (``torch.cuda.max_memory_allocated``).
    Returns None and does not raise (see ``raise_on_oom``); it skips, with one log line
    (CREDIT skips silently),
    when ``rank != 0`` (DEBUG), when CUDA is not available (the CPU-side fake-tensor
    prediction is logged instead, or why it failed), when the input shape cannot be
    inferred (WARNING), for an FSDP model (its step needs every rank), and when the
    synthetic pass raises (WARNING with the error).

    The input shape (see ``config.seed_layouts``): CREDIT's layout gives ``frames x (channels x
    levels + surface_channels + input_only_channels)`` values per grid point, built as
    the 5-D ``(trainer.train_batch_size, channels x levels + surface + input_only,
    frames, image_height, image_width)`` float32 tensor CREDIT's models take in
    ``forward`` (CREDIT's own preflight flattens frames into channels, a 4-D tensor that
    CrossFormer's Conv3d patch embedding cannot take; the element count, hence the
    memory, is the same), and the loss is the output's mean; ours gives ``(data.batch_size, block_size)`` int64 token ids with
    targets of the same shape and cross-entropy.

    Beyond the seed: two steps under ``trainer.precision``'s autocast and
    ``trainer.accumulation_steps`` micro-batches, a fake-tensor prediction logged
    next to the measurement, and everything the step touched restored afterwards
    (weights, buffers, gradients, optimizer and scaler state, RNG), in every case.
    ``batch=`` a real training batch instead of the zero one; ``loss_fn(model, batch)``
    (default: cross-entropy over ``(inputs, targets)``, or the output's mean for the
    CREDIT zero batch); ``scaler`` the fp16 GradScaler.

    A CUDA out-of-memory error is logged as an ERROR with the fix and not raised,
    unless ``raise_on_oom=True`` (then RuntimeError, after the state is restored). Not
    raising by default keeps the documented contract (``-> None``; the seed's callers
    call it unguarded, as a diagnostic before training) and the synthetic step is only
    a proxy of the training step (a zero batch of the shape the config implies, none of
    the activation checkpointing or memory handling the training code may add), so its
    OOM is the strongest warning this check gives, not a proof the run cannot fit. A
    run that must not start on it passes ``raise_on_oom=True``.
    """
    if rank != 0:
        log.debug("check_model_gpu_memory: skipped on rank %d (rank 0 reports)", rank)
        return
    if _is_fsdp(model):
        log.warning("check_model_gpu_memory: skipped for an FSDP model (its step needs every rank)")
        return
    spec = None
    if batch is None:
        spec = synthetic_input(conf)
        if spec is None:
            log.warning(
                "check_model_gpu_memory: skipped: cannot infer the input shape from the config (CREDIT's "
                "model.channels/levels/surface_channels/input_only_channels, or data.batch_size with "
                "data.train.block_size and model.vocab_size); pass batch=<first training batch>"
            )
            return
        if loss_fn is None and not spec.with_targets:
            loss_fn = output_mean_loss
    spec_text = f" on a {spec.describe()}" if spec is not None else ""
    credit = spec.layout == "credit" if spec is not None else is_credit_layout(conf)
    input_text = f"; input: {spec.describe()}" if spec is not None else ""
    try:
        device = next(unwrap(model).parameters()).device
    except Exception as error:  # a model without parameters has no step to measure
        log.warning("check_model_gpu_memory: skipped: the model has no parameters (%s)", error)
        return
    meter = _peak_meter(device) if torch.cuda.is_available() else None
    if meter is None:
        where = "no CUDA device" if not torch.cuda.is_available() else f"the model is on {device}, not on a CUDA device"
        try:
            # Meta tensors: the prediction needs shapes only, so no zero batch is allocated.
            example = batch if batch is not None else spec.make("meta")
            report = gpu_step_report(conf, model, optimizer, batch=example, loss_fn=loss_fn, scaler=scaler)
        except Exception as error:
            log.info("check_model_gpu_memory: skipped: %s, and the CPU-side prediction failed (%s: %s)",
                     where, type(error).__name__, error)
            return
        log.info("check_model_gpu_memory: %s: predicted CPU-side %s%s", where, report.predicted.describe(), input_text)
        return
    try:
        example = batch if batch is not None else spec.make(device)
        report = gpu_step_report(conf, model, optimizer, batch=example, loss_fn=loss_fn, scaler=scaler, meter=meter)
    except torch.cuda.OutOfMemoryError as error:
        error.__traceback__ = None  # its frames hold the step's tensors, which empty_cache must get back
        example = None
        message = _oom_message(error, spec_text, credit)
        _release_cached_memory()
        log.error(message)
        if raise_on_oom:
            raise RuntimeError(message) from None
        return
    except Exception as error:
        example = None
        _release_cached_memory()
        log.warning("check_model_gpu_memory: skipped: the synthetic pass%s failed (%s: %s); pass batch= and "
                    "loss_fn= if the model takes another input", spec_text, type(error).__name__, error)
        return
    example = None
    _release_cached_memory()
    log.info("check_model_gpu_memory: %s%s", report.describe(), input_text)
