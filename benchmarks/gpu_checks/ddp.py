"""DDP through the toolkit's StepRunner: gradient accumulation with ``no_sync`` on every
micro-batch but the last, counts summed over ranks, the result equal to one process
stepping on the whole global batch.

- gloo, 2 ranks on the CPU (forked processes: run before CUDA is initialised);
- NCCL with world size 1 on the GPU (two NCCL ranks cannot share one device).

A comm hook counts the all-reduces: with accumulation of A micro-batches and the model in
one bucket, one per optimizer step (A without no_sync).
"""

from __future__ import annotations

import gc
import importlib
import multiprocessing
import socket
import threading
import time
from typing import Any

import torch
from torch import nn

from benchmarks.gpu_checks.context import Context, error_text, free_cuda
from benchmarks.gpu_checks.report import NO_CUDA, Section

STEPS = 3
ACCUMULATION = 2
MICRO = 4  # samples per rank per micro-batch
TOLERANCE = 1e-5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def global_batches(world: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """[step][micro] -> the global micro-batch (world * MICRO samples)."""
    generator = torch.Generator().manual_seed(1)
    return [[(torch.randn(world * MICRO, 16, generator=generator), torch.randn(world * MICRO, 4, generator=generator))
             for _ in range(ACCUMULATION)] for _ in range(STEPS)]


def mse(model: nn.Module, batch: Any) -> torch.Tensor:
    inputs, targets = batch
    return ((model(inputs).float() - targets) ** 2).mean()


def make_runner(model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device, precision: str,
                distributed: bool, world: int) -> Any:
    from optimus_preflight.config.schema import GradScalerConfig
    from optimus_preflight.training.distributed import all_reduce_sum
    from optimus_preflight.training.precision import PrecisionPlan, make_grad_scaler
    from optimus_preflight.training.step import StepRunner

    plan = PrecisionPlan(precision, device)
    return StepRunner(model, optimizer, None, make_grad_scaler(plan, GradScalerConfig()), plan, mse,
                      clip_grad_norm=1.0, skip_nonfinite=True, accumulation_steps=ACCUMULATION,
                      reduce_sum=all_reduce_sum if distributed else None, world_size=world)


def train(model: nn.Module, runner: Any, batches: list[list[Any]]) -> list[float]:
    losses = []
    for step in batches:
        window = ((batch, index == len(step) - 1) for index, batch in enumerate(step))
        losses.append(float(runner.run(window).loss))
    return losses


def reference(world: int, device: torch.device, precision: str) -> tuple[list[torch.Tensor], list[float]]:
    """One process, no DDP, the same accumulation over the whole global micro-batches."""
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = train(model, make_runner(model, optimizer, device, precision, False, 1), global_batches(world))
    return [p.detach().cpu().clone() for p in model.parameters()], losses


def ddp_rank(rank: int, world: int, port: int, backend: str, device: torch.device, precision: str) -> dict[str, Any]:
    """One rank: DDP around the model, its shard of every global micro-batch."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = make_model().to(device)
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        calls = [0]

        def counting_hook(state, bucket):  # no annotations: DDP checks them against dist.GradBucket
            calls[0] += 1
            return allreduce_hook(None, bucket)

        ddp.register_comm_hook(None, counting_hook)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        shards = [[tuple(t[rank * MICRO:(rank + 1) * MICRO] for t in micro) for micro in step]
                  for step in global_batches(world)]
        started = time.perf_counter()
        losses = train(ddp, make_runner(ddp, optimizer, device, precision, world > 1, world), shards)
        result = {"rank": rank, "params": [p.detach().cpu().clone() for p in model.parameters()], "losses": losses,
                  "allreduce_calls": calls[0], "seconds": time.perf_counter() - started}
        # A rank that tears down while its peer still talks to it can block in gloo's
        # destructors for good (seen about once in six runs): leave together, and free
        # the DDP wrapper, which holds the group, before the group itself goes.
        dist.barrier()
        del ddp, optimizer
        gc.collect()
        return result
    finally:
        dist.destroy_process_group()


def _forked_rank(rank: int, world: int, port: int, queue: Any) -> None:
    torch.set_num_threads(1)
    try:
        result = ddp_rank(rank, world, port, "gloo", torch.device("cpu"), "fp32")
        queue.put({**result, "params": [p.tolist() for p in result["params"]]})
    except BaseException as error:  # reported to the parent, which decides
        queue.put({"rank": rank, "error": error_text(error)})


def compare(ranks: list[dict[str, Any]], expected: tuple[list[torch.Tensor], list[float]], world: int) -> dict[str, Any]:
    """Every rank's weights against the one-process reference; the all-reduce count."""
    weights, losses = expected
    diffs = [max(float((torch.as_tensor(p) - q).abs().max()) for p, q in zip(r["params"], weights)) for r in ranks]
    # Each rank's loss is its own shard's mean; with equal shards their average is the global mean.
    averaged = [sum(step) / len(step) for step in zip(*(r["losses"] for r in ranks))]
    loss_diff = max(abs(a - b) for a, b in zip(averaged, losses))
    calls = [r["allreduce_calls"] for r in ranks]
    row = {
        "world_size": world, "max_weight_diff": max(diffs), "max_loss_diff": loss_diff,
        "allreduce_calls": calls[0], "allreduce_expected": STEPS,
    }
    ok = max(diffs) <= TOLERANCE and loss_diff <= 1e-4 and all(c == STEPS for c in calls)
    return {"status": "passed" if ok else "failed", **row}


def gloo_two_ranks(timeout_s: float) -> dict[str, Any]:
    """Two forked CPU processes. fork is only safe before CUDA or OpenMP threads exist; else spawn."""
    method = "fork" if not torch.cuda.is_initialized() and threading.active_count() == 1 else "spawn"
    # Imported once here, so forked ranks do not each import them again.
    # DDP.__init__ imports torch._dynamo: seconds per rank on a busy core.
    for module in ("torch._dynamo", "torch.distributed.algorithms.ddp_comm_hooks.default_hooks",
                   "optimus_preflight.training.step",
                   "optimus_preflight.training.distributed", "optimus_preflight.training.precision"):
        importlib.import_module(module)

    mp = multiprocessing.get_context(method)
    queue = mp.Queue()
    port = free_port()
    processes = [mp.Process(target=_forked_rank, args=(rank, 2, port, queue), daemon=True) for rank in range(2)]
    started = time.monotonic()
    for process in processes:
        process.start()
    results = []
    try:
        for _ in processes:
            results.append(queue.get(timeout=max(timeout_s - (time.monotonic() - started), 1.0)))
    except Exception:
        return {"status": "error", "error": f"a rank did not report within {timeout_s:.0f} s ({method})"}
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
    failed = [r for r in results if "error" in r]
    if failed:
        return {"status": "error", "error": "; ".join(f"rank {r['rank']}: {r['error']}" for r in failed)}
    outcome = compare(sorted(results, key=lambda r: r["rank"]), reference(2, torch.device("cpu"), "fp32"), 2)
    return {**outcome, "start_method": method, "seconds": round(time.monotonic() - started, 2)}


def nccl_one_rank(device: torch.device) -> dict[str, Any]:
    started = time.monotonic()
    result = ddp_rank(0, 1, free_port(), "nccl", device, "fp32")
    outcome = compare([result], reference(1, device, "fp32"), 1)
    free_cuda()
    return {**outcome, "seconds": round(time.monotonic() - started, 2)}


def ddp_section(ctx: Context, section: Section) -> None:
    section.columns = ["part", "backend", "world_size", "max_weight_diff", "max_loss_diff", "allreduce_calls",
                       "allreduce_expected", "seconds", "status", "reason"]
    try:
        gloo = gloo_two_ranks(min(ctx.left() - 5, 120))
    except Exception as error:
        gloo = {"status": "error", "error": error_text(error)}
    section.add(gloo.pop("status"), None, part="2 ranks on the CPU", backend="gloo", **gloo)
    if not ctx.cuda:
        section.add("skipped", f"{NO_CUDA}: NCCL needs a GPU", part="1 rank on the GPU", backend="nccl")
    else:
        try:
            nccl = nccl_one_rank(ctx.device)
        except Exception as error:
            nccl = {"status": "error", "error": error_text(error)}
        section.add(nccl.pop("status"), None, part="1 rank on the GPU", backend="nccl", **nccl)
    ran = [r for r in section.rows if r["status"] != "skipped"]
    section.headline = "; ".join(
        f"{r['backend']} x{r.get('world_size', '?')}: {r['status']}"
        + (f" (weights within {r['max_weight_diff']:.1e}, {r['allreduce_calls']} all-reduces for {STEPS} steps)"
           if "max_weight_diff" in r else f" ({r.get('error')})") for r in ran)
    section.notes.append(f"{STEPS} optimizer steps of {ACCUMULATION} micro-batches each through StepRunner (no_sync on "
                         "all but the last micro-batch, counts summed over ranks), SGD with momentum, clipping at 1.0; "
                         "compared with one process without DDP stepping on the whole global micro-batches.")
    section.left += ["NCCL with 2 or more ranks, and the recipe's own DDP under torchrun on GPUs: need 2 GPUs "
                     "(NCCL refuses two ranks on one device; with one rank the recipe does not wrap the model)",
                     "DDP with bf16/fp16 autocast across ranks"]
