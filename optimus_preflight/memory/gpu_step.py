"""``check_model_gpu_memory``: a real synthetic training step on the GPU, next to the prediction.

CREDIT's function of the same name runs a forward/backward/step on zeros and leaves the
weights changed. This one runs two steps of the real first batch under the configured
autocast, then restores everything it touched (weights, buffers, gradients, optimizer
and scaler state, RNG states). It calls the module inside a DDP wrapper, under
``no_sync``, so no collective is issued and the other ranks are not waited for. On a
machine without CUDA it logs the CPU-side estimate instead of skipping silently.

Signature: ``check_model_gpu_memory(conf, model, optimizer, rank=0, *, batch=None,
loss_fn=None, scaler=None)``. ``batch`` is a training batch (the first one from the
loader); ``loss_fn(model, batch)`` returns a loss or ``(loss, count)`` and defaults to
cross-entropy over ``(inputs, targets)``. Without a batch the shapes are unknown, so it
logs that and returns.
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
from optimus_preflight.memory.estimate import estimate_training_step
from optimus_preflight.memory.fake_copy import fake_copy_factory, optimizer_factory_like
from optimus_preflight.memory.result import MemoryEstimate, gib
from optimus_preflight.memory.steps import run_training_steps
from optimus_preflight.training.batches import move_to_device
from optimus_preflight.training.distributed import unwrap

log = logging.getLogger("optimus_preflight")


def default_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """Cross-entropy for ``(inputs, targets)`` batches, as ``TrainRecipe.compute_loss``."""
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=-100)


@dataclass
class GpuStepReport:
    predicted: MemoryEstimate
    measured_peak_bytes: int | None = None
    device: str = "cpu"

    @property
    def predicted_bytes(self) -> int:
        """Comparable with ``torch.cuda.max_memory_allocated``: allocator peak plus workspaces."""
        return (self.predicted.allocator_peak_bytes or self.predicted.peak_bytes) + self.predicted.workspace_bytes

    @property
    def error(self) -> float | None:
        if not self.measured_peak_bytes:
            return None
        return (self.predicted_bytes - self.measured_peak_bytes) / self.measured_peak_bytes

    def describe(self) -> str:
        if self.measured_peak_bytes is None:
            return f"no CUDA device: predicted CPU-side {self.predicted.describe()}"
        return (
            f"GPU step on {self.device}: measured peak {gib(self.measured_peak_bytes)} "
            f"(torch.cuda.max_memory_allocated), predicted {gib(self.predicted_bytes)} "
            f"({self.error:+.1%}); {self.predicted.describe()}"
        )


def _config_value(conf: Any, dotted: str, default: Any) -> Any:
    node = conf
    for part in dotted.split("."):
        node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
        if node is None:
            return default
    return node


def _precision(conf: Any, device: torch.device) -> str:
    requested = str(_config_value(conf, "trainer.precision", "fp32"))
    if requested != "auto":
        return requested
    from optimus_preflight.training.precision import resolve_precision

    return resolve_precision("auto", device)


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


def gpu_step_report(
    conf: Any,
    model: nn.Module,
    optimizer: Optimizer,
    *,
    batch: Any,
    loss_fn: Callable[[nn.Module, Any], Any] | None = None,
    scaler: Any = None,
) -> GpuStepReport:
    """Predict (fake tensors) and, on CUDA, measure two training steps of ``batch``."""
    loss_fn = loss_fn or default_loss
    module = unwrap(model)
    device = next(module.parameters()).device
    precision = _precision(conf, device)
    accumulation = int(_config_value(conf, "trainer.accumulation_steps", 1))
    predicted = estimate_training_step(
        fake_copy_factory(module),
        batch,
        loss_fn,
        optimizer_factory_like(optimizer, module),
        precision=precision,
        device="cuda" if device.type == "cuda" else "cpu",
        accumulation_steps=accumulation,
    )
    if device.type != "cuda":
        return GpuStepReport(predicted)
    measured = run_synthetic_steps(
        model, optimizer, batch, loss_fn, precision=precision, accumulation_steps=accumulation, scaler=scaler
    )
    return GpuStepReport(predicted, measured, str(device))


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


def check_model_gpu_memory(
    conf: Any,
    model: nn.Module,
    optimizer: Optimizer,
    rank: int = 0,
    *,
    batch: Any = None,
    loss_fn: Callable[[nn.Module, Any], Any] | None = None,
    scaler: Any = None,
) -> None:
    """Run two synthetic training steps and log the measured peak next to the prediction.

    Only rank 0 runs (the step issues no collectives). A CUDA OOM is logged with the
    prediction and re-raised as a RuntimeError after the state is restored.
    """
    if rank != 0:
        return
    if batch is None:
        log.warning(
            "check_model_gpu_memory: no batch given, so the input shapes are unknown; pass batch=<first training batch>"
        )
        return
    if _is_fsdp(model):
        log.warning("check_model_gpu_memory: skipped for an FSDP model (its step needs every rank)")
        return
    try:
        report = gpu_step_report(conf, model, optimizer, batch=batch, loss_fn=loss_fn, scaler=scaler)
    except torch.cuda.OutOfMemoryError as error:
        raise RuntimeError(
            f"check_model_gpu_memory: the synthetic training step ran out of GPU memory ({error}). "
            "Reduce data.batch_size, set trainer.precision=bf16 or use activation checkpointing; "
            "the memory.vram_headroom preflight check predicts the largest micro-batch that fits."
        ) from None
    log.info("check_model_gpu_memory: %s", report.describe())
