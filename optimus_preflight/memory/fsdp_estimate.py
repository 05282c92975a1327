"""The peak memory of one rank of N under FSDP2, traced on fake tensors with a fake process group.

The real FSDP2 step runs: the model is built (fake), copied to the meta device, wrapped
as training wraps it (``find_blocks``, activation checkpointing per block when asked, then
``shard_model``: ``fully_shard`` per block with ``reshard_after_forward``, then the root,
bf16 ``MixedPrecisionPolicy`` with fp32 reduction for ``precision="bf16"``), materialized
as fake CPU tensors (``to_empty``: FSDP2 pads each shard's dim 0 as in training), and two
full steps (forward under autocast, backward, ``optimizer.step()``, ``zero_grad``) run
under a fake process group of ``world_size`` ranks while ``FSDPStorageTracker`` counts
live storages. What FSDP2 allocates is therefore what is counted: the sharded parameters,
gradients and optimizer state, the all-gather buffers and gathered parameters of the
blocks live at once (including the prefetched next block, forward and backward), the
reduce-scatter buffers (kept until the next reduce-scatter), the bf16 copies and the
activations. The traced rank is rank 0, which holds the largest shards.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch._subclasses import FakeTensorMode
from torch.optim import Optimizer

from optimus_preflight.memory import cuda_rules
from optimus_preflight.memory.fake_world import fake_process_group, run_isolated
from optimus_preflight.memory.fsdp_analytic import fsdp_analytic_estimate
from optimus_preflight.memory.fsdp_optimizer import on_local_shards
from optimus_preflight.memory.fsdp_result import FSDPMemoryEstimate
from optimus_preflight.memory.fsdp_tracker import FSDPStorageTracker
from optimus_preflight.memory.optimizer_paths import step_implementation
from optimus_preflight.memory.steps import run_training_steps
from optimus_preflight.memory.user_state import UserState, quiet_fake_tensor_log
from optimus_preflight.training.batches import map_batch
from optimus_preflight.training.precision import autocast_dtype, device_type

FSDP_NOTES = (
    "FSDP2 per rank: traced for rank 0 of world_size (the largest shards) with a fake process group",
    "CUDA streams are not modelled: the caching allocator may hold more than the live tensors "
    "when FSDP2's all-gather and reduce-scatter streams overlap compute",
)


def estimate_fsdp_step(
    model_fn: Callable[[], nn.Module],
    example_batch: Any,
    loss_fn: Callable[[nn.Module, Any], Any],
    build_optimizer: Callable[[nn.Module], Optimizer],
    *,
    world_size: int,
    precision: str = "fp32",
    device: str | torch.device = "cpu",
    accumulation_steps: int = 1,
    block_classes: Sequence[str] = (),
    activation_checkpointing: bool = False,
    reshard_after_forward: bool = True,
    steps: int = 2,
) -> FSDPMemoryEstimate:
    """Peak live bytes of one rank of ``world_size`` over ``steps`` FSDP2 training steps.

    ``build_optimizer(model)`` gets the sharded model (its parameters are DTensors, as in
    training). Falls back to ``method="analytic"`` (``fsdp_analytic``; its assumptions in
    ``notes``) when the trace fails. ``notes`` also say where the trace ran: in this
    process, or in a forked child when this process has a process group of its own.
    """
    device = device_type(device)
    dtype = autocast_dtype(precision)
    if dtype is torch.float16:
        raise ValueError("precision='fp16' is not supported with FSDP (training refuses it too): use bf16")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
    started = time.perf_counter()
    options = dict(
        world_size=world_size, precision=precision, device=device, accumulation_steps=accumulation_steps,
        block_classes=tuple(block_classes), activation_checkpointing=activation_checkpointing,
        reshard_after_forward=reshard_after_forward, steps=steps,
    )
    batch = map_batch(lambda leaf: _shape_only(leaf), example_batch)
    kept = UserState(model_fn, build_optimizer, loss_fn)  # the trace in this process must leave no fake behind
    try:
        estimate, where = run_isolated(lambda: _trace(model_fn, batch, loss_fn, build_optimizer, **options))
    except Exception as error:  # an op fake tensors cannot run, or no isolated process
        text = str(error).strip()
        reason = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
        return fsdp_analytic_estimate(model_fn, example_batch, build_optimizer, reason=reason, started=started,
                                      **{k: v for k, v in options.items() if k != "steps"})
    finally:
        kept.restore()
    estimate.elapsed_s, estimate.where = time.perf_counter() - started, where
    estimate.notes.append(f"traced {where} in {estimate.elapsed_s:.2f} s")
    return estimate


def _trace(
    model_fn: Callable[[], nn.Module],
    batch: Any,
    loss_fn: Callable[[nn.Module, Any], Any],
    build_optimizer: Callable[[nn.Module], Optimizer],
    *,
    world_size: int,
    precision: str,
    device: str,
    accumulation_steps: int,
    block_classes: tuple[str, ...],
    activation_checkpointing: bool,
    reshard_after_forward: bool,
    steps: int,
    local_optimizer: bool = True,
) -> FSDPMemoryEstimate:
    """The traced estimate (see the module docstring); ``local_optimizer=False`` steps the
    real optimizer on the DTensors instead of its copy over the local shards (fsdp_optimizer)."""
    from optimus_preflight.memory.estimate import _cuda_policy, prefer_foreach
    from optimus_preflight.training.sharding import apply_activation_checkpointing, find_blocks, shard_model

    allocator = cuda_rules.CachingAllocatorModel() if device == "cuda" else None
    tracker = FSDPStorageTracker(
        round_bytes=cuda_rules.round_size if device == "cuda" else None,
        on_alloc=allocator.malloc if allocator else None,
        on_free=allocator.free if allocator else None,
    )
    python_rng = random.getstate()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with quiet_fake_tensor_log(), torch.random.fork_rng(devices=[]), fake_process_group(world_size):
            with fake_mode:
                built = model_fn()
            model = meta_copy(built)  # sharded on the meta device: nothing is allocated yet
            del built
            blocks = find_blocks(model, block_classes)
            if activation_checkpointing:
                if not blocks:
                    raise ValueError(f"activation_checkpointing: {type(model).__name__} has no repeated blocks")
                apply_activation_checkpointing(blocks)
            with _quiet(logging.getLogger("optimus_preflight")):  # training's "FSDP2: n blocks sharded" line
                shard_model(model, torch.device("cpu"), world_size, precision=precision,
                            reshard_after_forward=reshard_after_forward, blocks=blocks)
            with fake_mode, tracker:
                tracker.where = "model materialization"
                model.to_empty(device="cpu")
                model.train()
                tracker.relabel(list(model.parameters()), "params")
                tracker.relabel(list(model.buffers()), "buffers")
                tracker.where = "optimizer construction"
                optimizer = build_optimizer(model)
                if device == "cuda":
                    prefer_foreach(optimizer)
                optimizer_step = step_implementation(optimizer, device)
                tracker.reset_peak()
                if allocator is not None:
                    allocator.peak_allocated, allocator.peak_reserved = allocator.allocated, allocator.reserved
                run_training_steps(
                    model, on_local_shards(optimizer) if local_optimizer else optimizer, lambda: _fresh_like(batch), loss_fn, tracker,
                    precision=precision, accumulation_steps=accumulation_steps, steps=steps,
                    autocast_policy=_cuda_policy(precision) if device == "cuda" else None,
                )
                del model, optimizer
    finally:
        random.setstate(python_rng)
    estimate = FSDPMemoryEstimate.from_tracker(
        tracker,
        method="fake",
        elapsed_s=0.0,
        device=device,
        precision=precision,
        accumulation_steps=accumulation_steps,
        optimizer_step=optimizer_step,
        notes=[*FSDP_NOTES[: 2 if device == "cuda" else 1], _wrapping_note(len(blocks), world_size,
                                                                            activation_checkpointing, precision)],
        world_size=world_size,
        activation_checkpointing=activation_checkpointing,
    )
    if allocator is not None:
        from optimus_preflight.memory.estimate import CUDA_NOTES

        estimate.add_cuda_allocator(allocator, CUDA_NOTES)
    return estimate


@contextlib.contextmanager
def _quiet(logger: logging.Logger):
    def drop_info(record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO

    logger.addFilter(drop_info)
    try:
        yield
    finally:
        logger.removeFilter(drop_info)


def _wrapping_note(blocks: int, world_size: int, checkpointing: bool, precision: str) -> str:
    text = f"fully_shard on {blocks} blocks then the root, {world_size} ranks"
    if checkpointing:
        text += ", activation checkpointing per block"
    if precision == "bf16":
        text += ", bf16 parameters with fp32 gradient reduction"
    return text


def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are meta tensors of the same
    shapes, strides, dtypes and ``requires_grad`` (shared tensors stay shared)."""
    memo: dict[int, Any] = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        if id(tensor) in memo:
            continue
        meta = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
        if isinstance(tensor, nn.Parameter):
            meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = meta
    return copy.deepcopy(model, memo)


def _shape_only(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        return torch.empty(leaf.shape, dtype=leaf.dtype, device="meta")
    return leaf


def _fresh_like(value: Any) -> Any:
    return map_batch(lambda leaf: torch.empty(leaf.shape, dtype=leaf.dtype) if isinstance(leaf, torch.Tensor) else leaf,
                     value)
