"""The reference for the FSDP2 estimate: the same steps on real CPU tensors, one process per rank.

``measure_fsdp_steps`` spawns ``world_size`` processes joined by gloo, and each runs the
real FSDP2 step the estimate traces (same wrapping: ``find_blocks``, activation
checkpointing, ``shard_model``; same steps: ``run_training_steps``) while the same
``FSDPStorageTracker`` counts its live storages. It returns each rank's peak. The ranks
are forked (spawned where the platform cannot fork: then the callables must be picklable,
module-level functions and classes); the calling process must have no process group.
"""

from __future__ import annotations

import os
import queue as queue_module
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.memory.fsdp_result import FSDPMemoryEstimate
from optimus_preflight.memory.fsdp_tracker import FSDPStorageTracker
from optimus_preflight.memory.optimizer_paths import step_implementation
from optimus_preflight.memory.steps import run_training_steps
from optimus_preflight.training.batches import map_batch

Case = tuple  # (model_fn, batch, loss_fn, build_optimizer, options: dict)


def measure_fsdp_steps(
    cases: Sequence[Case], *, world_size: int = 2, seed: int = 0, timeout_s: float = 300.0
) -> list[list[FSDPMemoryEstimate]]:
    """For each case ``(model_fn, batch, loss_fn, build_optimizer, options)`` (options:
    ``precision``, ``activation_checkpointing``, ``block_classes``, ``reshard_after_forward``,
    ``accumulation_steps``, ``steps``), the measured estimate of every rank, rank 0 first.
    All cases run in one set of ``world_size`` processes (one start-up for all)."""
    import torch.multiprocessing as mp

    from optimus_preflight.memory.fake_world import has_process_group

    if has_process_group():
        raise RuntimeError("measure_fsdp_steps starts its own gloo group: call it where no process group exists")
    with tempfile.TemporaryDirectory() as folder:
        init_file = os.path.join(folder, "rendezvous")
        # Fork where there is fork: the ranks inherit the imported modules (seconds each
        # under spawn) and the cases need not be picklable.
        context = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        queue = context.Queue()
        workers = [
            context.Process(target=_rank_main, args=(rank, world_size, init_file, list(cases), seed, queue))
            for rank in range(world_size)
        ]
        for worker in workers:
            worker.start()
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(results) < world_size:
                try:
                    rank, payload = queue.get(timeout=1.0)
                    results[rank] = payload
                except queue_module.Empty:
                    dead = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
                    if dead or time.monotonic() > deadline:
                        raise RuntimeError(f"the measured FSDP ranks died or hung (exit codes {dead})") from None
        finally:
            for worker in workers:
                worker.join(10)
                if worker.is_alive():
                    worker.kill()
    failed = {rank: payload for rank, payload in results.items() if isinstance(payload, str)}
    if failed:
        raise RuntimeError(f"the measured FSDP steps failed: {failed}")
    return [[results[rank][index] for rank in range(world_size)] for index in range(len(cases))]


def _rank_main(rank: int, world_size: int, init_file: str, cases: list[Case], seed: int, queue: Any) -> None:
    import traceback

    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
        try:
            measured = [_measure(*case, world_size=world_size, seed=seed) for case in cases]
        finally:
            dist.destroy_process_group()
        queue.put((rank, measured))
    except BaseException:  # noqa: B036 - the parent must hear of any failure
        queue.put((rank, traceback.format_exc()))


def _measure(
    model_fn: Callable[[], nn.Module],
    batch: Any,
    loss_fn: Callable[[nn.Module, Any], Any],
    build_optimizer: Callable[[nn.Module], Optimizer],
    options: dict[str, Any],
    *,
    world_size: int,
    seed: int,
) -> FSDPMemoryEstimate:
    from optimus_preflight.training.sharding import apply_activation_checkpointing, find_blocks, shard_model

    precision = options.get("precision", "fp32")
    checkpointing = bool(options.get("activation_checkpointing", False))
    accumulation_steps = int(options.get("accumulation_steps", 1))
    started = time.perf_counter()
    torch.manual_seed(seed)
    model = model_fn()
    blocks = find_blocks(model, options.get("block_classes", ()))
    if checkpointing:
        apply_activation_checkpointing(blocks)
    shard_model(model, torch.device("cpu"), world_size, precision=precision,
                reshard_after_forward=options.get("reshard_after_forward", True), blocks=blocks)
    model.train()
    optimizer = build_optimizer(model)
    tracker = FSDPStorageTracker()
    tracker.track(list(model.parameters()), "params")
    tracker.track(list(model.buffers()), "buffers")
    with tracker:
        tracker.reset_peak()
        run_training_steps(
            model, optimizer, lambda: map_batch(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, batch),
            loss_fn, tracker, precision=precision, accumulation_steps=accumulation_steps,
            steps=int(options.get("steps", 2)),
        )
    return FSDPMemoryEstimate.from_tracker(
        tracker,
        method="measured",
        elapsed_s=time.perf_counter() - started,
        precision=precision,
        accumulation_steps=accumulation_steps,
        optimizer_step=step_implementation(optimizer, "cpu"),
        world_size=world_size,
        activation_checkpointing=checkpointing,
        where="gloo",
    )
