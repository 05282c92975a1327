"""Predict the peak memory of real training steps without allocating the model.

The model, the optimizer and every intermediate are fake tensors
(``torch._subclasses.FakeTensorMode``): shapes, dtypes and strides, no data. The real
forward, backward, ``optimizer.step()`` and ``zero_grad`` of two steps run on them
while a ``StorageTracker`` counts live storages, so the estimate includes what formula
estimators miss (autocast copies, optimizer state, temporaries of backward and of the
optimizer, the second step's state) and costs seconds even for a 7B model.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch._subclasses import FakeTensor, FakeTensorMode
from torch.optim import Optimizer

from optimus_preflight.memory import cuda_rules
from optimus_preflight.memory.analytic import analytic_estimate
from optimus_preflight.memory.cuda_autocast import CudaAutocastPolicy
from optimus_preflight.memory.fake_copy import fake_copy_factory
from optimus_preflight.memory.optimizer_paths import step_implementation
from optimus_preflight.memory.result import MemoryEstimate
from optimus_preflight.memory.steps import run_training_steps
from optimus_preflight.memory.tracker import StorageTracker
from optimus_preflight.memory.user_state import UserState, quiet_fake_tensor_log
from optimus_preflight.training.batches import map_batch
from optimus_preflight.training.precision import autocast_dtype, device_type

CUDA_NOTES = (
    "simulated on fake CPU tensors with the CUDA allocator's rounding: a CPU-only torch build "
    "cannot run fake cuda tensors through backward, so kernels are the CPU ones (kernel-internal "
    "workspaces, e.g. cuDNN's, are not counted); CUDA's autocast op lists are applied on top of CPU autocast",
    "optimizers that default to foreach on CUDA were run with foreach=True, whose temporaries are counted",
    "context_bytes (CUDA context) and workspace_bytes (cuBLAS workspaces) are allowances, not in peak_bytes",
)


def estimate_step_memory(
    model_fn: Callable[[], nn.Module],
    example_batch: Any,
    loss_fn: Callable[[nn.Module, Any], Any],
    optimizer_fn: Callable[[Any], Optimizer],
    *,
    precision: str = "fp32",
    device: str = "cpu",
    accumulation_steps: int = 1,
    strategy: str | None = None,
    world_size: int | None = None,
    block_classes: Sequence[str] = (),
    activation_checkpointing: bool = False,
    reshard_after_forward: bool = True,
) -> MemoryEstimate:
    """Peak memory of two full training steps, traced on fake tensors (the contract: docs/ARCHITECTURE.md).

    ``example_batch`` is a tensor or a nested list/tuple/dict of tensors; only shapes
    and dtypes are used (meta tensors are fine). ``loss_fn(model, batch)`` returns a
    scalar loss or ``(loss, count)``. Falls back to ``method="analytic"`` with the
    reason when tracing fails (data-dependent ops such as ``.item()`` or ``nonzero``).

    ``strategy="fsdp", world_size=N``: the peak of one rank of N under FSDP2 (an
    ``FSDPMemoryEstimate``; see fsdp_estimate), with the blocks ``block_classes`` names
    (default: the largest list of repeated modules) sharded one by one as training shards
    them, optionally with ``activation_checkpointing`` per block. ``strategy=None`` or
    ``"single"``: one device, the whole model (the other FSDP arguments must be left out).
    """
    if strategy == "fsdp":
        from optimus_preflight.memory.fsdp_estimate import estimate_fsdp_step

        if world_size is None:
            raise ValueError("strategy='fsdp' needs world_size (the number of ranks sharding the model)")
        return estimate_fsdp_step(
            model_fn,
            example_batch,
            loss_fn,
            lambda model: optimizer_fn(model.parameters()),
            world_size=world_size,
            precision=precision,
            device=device,
            accumulation_steps=accumulation_steps,
            block_classes=block_classes,
            activation_checkpointing=activation_checkpointing,
            reshard_after_forward=reshard_after_forward,
        )
    if strategy not in (None, "single"):
        raise ValueError(f"strategy must be 'single' (or None) or 'fsdp', got {strategy!r}")
    if world_size not in (None, 1) or block_classes or activation_checkpointing or not reshard_after_forward:
        raise ValueError("world_size, block_classes, activation_checkpointing and reshard_after_forward "
                         "apply to strategy='fsdp' only")
    return estimate_training_step(
        model_fn,
        example_batch,
        loss_fn,
        lambda model: optimizer_fn(model.parameters()),
        precision=precision,
        device=device,
        accumulation_steps=accumulation_steps,
    )


def estimate_training_step(
    model_fn: Callable[[], nn.Module],
    example_batch: Any,
    loss_fn: Callable[[nn.Module, Any], Any],
    build_optimizer: Callable[[nn.Module], Optimizer],
    *,
    precision: str = "fp32",
    device: str | torch.device = "cpu",
    accumulation_steps: int = 1,
    steps: int = 2,
) -> MemoryEstimate:
    """Like ``estimate_step_memory`` but the optimizer builder gets the model (a recipe's
    ``build_optimizer(model)``, which groups parameters by module)."""
    device = device_type(device)
    autocast_dtype(precision)
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
    started = time.perf_counter()
    allocator = cuda_rules.CachingAllocatorModel() if device == "cuda" else None
    tracker = StorageTracker(
        round_bytes=cuda_rules.round_size if device == "cuda" else None,
        on_alloc=allocator.malloc if allocator else None,
        on_free=allocator.free if allocator else None,
    )
    progress: dict[str, Any] = {}
    optimizer_step = ""
    python_rng = random.getstate()
    # What the user's callables store during the trace (a loss's running value: a fake
    # tensor) must not reach the real run: their reachable state is put back after.
    kept = UserState(model_fn, build_optimizer, loss_fn)
    try:
        # A factory may seed the generators; the run that follows must not notice the estimate.
        with quiet_fake_tensor_log(), torch.random.fork_rng(devices=[]), FakeTensorMode(allow_non_fake_inputs=True), \
                tracker:
            model, optimizer = _build(model_fn, build_optimizer, tracker, device, progress)
            tracker.reset_peak()
            if allocator is not None:
                allocator.peak_allocated, allocator.peak_reserved = allocator.allocated, allocator.reserved
            run_training_steps(
                model,
                optimizer,
                lambda: _fresh_like(example_batch),
                loss_fn,
                tracker,
                precision=precision,
                accumulation_steps=accumulation_steps,
                steps=steps,
                autocast_policy=_cuda_policy(precision) if device == "cuda" else None,
            )
            optimizer_step = progress["optimizer_step"]
    except Exception as error:  # a data-dependent op, or an op fake tensors cannot run
        text = str(error).strip()
        reason = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
        with torch.random.fork_rng(devices=[]):
            return analytic_estimate(
                model_fn,
                example_batch,
                build_optimizer,
                precision=precision,
                device=device,
                accumulation_steps=accumulation_steps,
                partial=tracker if progress.get("built") else None,
                reason=f"tracing failed at {tracker.where} ({reason})",
                started=started,
                model=progress.get("model"),
                optimizer=progress.get("optimizer"),
            )
    finally:
        progress.clear()  # drop the fake model and optimizer
        random.setstate(python_rng)
        kept.restore()
    estimate = MemoryEstimate.from_tracker(
        tracker,
        method="fake",
        elapsed_s=time.perf_counter() - started,
        device=device,
        precision=precision,
        accumulation_steps=accumulation_steps,
        optimizer_step=optimizer_step,
    )
    if allocator is not None:
        estimate.add_cuda_allocator(allocator, CUDA_NOTES)
    return estimate


def measure_step_memory(
    model_fn: Callable[[], nn.Module],
    example_batch: Any,
    loss_fn: Callable[[nn.Module, Any], Any],
    optimizer_fn: Callable[[Any], Optimizer],
    *,
    precision: str = "fp32",
    accumulation_steps: int = 1,
    steps: int = 2,
) -> MemoryEstimate:
    """The same two steps on real CPU tensors, counted by the same tracker: the reference
    the estimate is checked against (``example_batch`` must hold real values here)."""
    started = time.perf_counter()
    model = model_fn()
    model.train()
    optimizer = optimizer_fn(model.parameters())
    tracker = StorageTracker()
    tracker.track(list(model.parameters()), "params")
    tracker.track(list(model.buffers()), "buffers")
    with tracker:
        tracker.reset_peak()
        run_training_steps(
            model,
            optimizer,
            lambda: _clone(example_batch),
            loss_fn,
            tracker,
            precision=precision,
            accumulation_steps=accumulation_steps,
            steps=steps,
        )
    return MemoryEstimate.from_tracker(
        tracker,
        method="measured",
        elapsed_s=time.perf_counter() - started,
        precision=precision,
        accumulation_steps=accumulation_steps,
        optimizer_step=step_implementation(optimizer, "cpu"),
    )


def _build(
    model_fn: Callable[[], nn.Module],
    build_optimizer: Callable[[nn.Module], Optimizer],
    tracker: StorageTracker,
    device: str,
    progress: dict[str, Any],
) -> tuple[nn.Module, Optimizer]:
    tracker.phase, tracker.where = "other", "model construction"
    model = model_fn()
    if not _all_fake_cpu(model):
        # Real weights (a model built before the call) or tensors on a GPU: trace a fake
        # CPU copy instead; fake cuda tensors would abort a CPU-only build in backward.
        model = fake_copy_factory(model)()
    model.train()
    tracker.relabel(list(model.parameters()), "params")
    tracker.relabel(list(model.buffers()), "buffers")
    progress["model"] = model
    progress["built"] = True
    tracker.where = "optimizer construction"
    optimizer = build_optimizer(model)
    if device == "cuda":
        prefer_foreach(optimizer)
    progress["optimizer"] = optimizer
    progress["optimizer_step"] = step_implementation(optimizer, device)
    return model, optimizer


def _all_fake_cpu(model: nn.Module) -> bool:
    tensors = itertools.chain(model.parameters(), model.buffers())
    return all(isinstance(t, FakeTensor) and t.device.type == "cpu" for t in tensors)


def _cuda_policy(precision: str) -> Callable[[], CudaAutocastPolicy] | None:
    dtype = autocast_dtype(precision)
    return (lambda: CudaAutocastPolicy(dtype)) if dtype is not None else None


def prefer_foreach(optimizer: Optimizer) -> None:
    """On CUDA, torch's optimizers default to their foreach implementation (whose
    temporaries span all parameters at once); fake CPU tensors would pick the
    per-tensor loop, so choose foreach explicitly where the user left it open."""
    if "foreach" not in optimizer.defaults:
        return
    for group in optimizer.param_groups:
        if group.get("foreach") is None and not group.get("fused") and not group.get("differentiable"):
            group["foreach"] = True


def _fresh_like(value: Any) -> Any:
    """A new (fake) batch with the example's shapes and dtypes."""
    return map_batch(lambda leaf: torch.empty(leaf.shape, dtype=leaf.dtype) if isinstance(leaf, torch.Tensor) else leaf, value)


def _clone(value: Any) -> Any:
    return map_batch(lambda leaf: leaf.clone() if isinstance(leaf, torch.Tensor) else leaf, value)
