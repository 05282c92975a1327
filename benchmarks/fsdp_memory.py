"""Per-rank FSDP2 memory: the 7B Llama-shaped verdict at 80 GiB from a CPU, and the estimate's error.

1. A Llama-7B-shaped model (hidden 4096, 32 layers, 32 heads, SwiGLU 11008, vocab 32000;
   built on the meta device), seq 2048, micro-batch 1, bf16 (FSDP2 MixedPrecisionPolicy:
   bf16 parameters, fp32 reduction; bf16 autocast), AdamW (foreach, CUDA's default),
   simulated for a CUDA GPU: the predicted peak of one rank for each world size, with and
   without activation checkpointing per block, each traced on fake tensors under a fake
   process group, and the smallest world size whose rank fits an 80 GiB GPU (the
   preflight's usable memory: min(95%, total - 0.5 GiB) less the CUDA context).
2. The estimate against the measured peak of the same FSDP2 steps on 2 CPU ranks (gloo,
   live storages counted in each rank) for three small models.

Run: ``.venv/bin/python benchmarks/fsdp_memory.py [--world-sizes 1,2,4,8,16] [--target-gib 80]
[--no-validation]``. Every figure comes with the seconds it took; the last line is the headline.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fsdp_models

from optimus_preflight.memory.cuda_rules import CUDA_CONTEXT_BYTES  # noqa: E402
from optimus_preflight.memory.fsdp_estimate import estimate_fsdp_step  # noqa: E402
from optimus_preflight.memory.fsdp_measure import measure_fsdp_steps  # noqa: E402
from optimus_preflight.memory.result import GIB  # noqa: E402
from optimus_preflight.preflight.analyses.memory_fsdp import need_bytes, smallest_world_size  # noqa: E402
from tests.fsdp_models import LLAMA_7B, adamw, llama_7b, lm_loss, validation_cases  # noqa: E402

SEQ, MICRO_BATCH = 2048, 1


def usable_bytes(target_gib: float, fraction: float = 0.95, reserve_gib: float = 0.5) -> int:
    """What the preflight leaves for tensors on a GPU of ``target_gib`` (memory_checks.gpu_memory_limit)."""
    total = target_gib * GIB
    return int(min(fraction * total, total - reserve_gib * GIB) - CUDA_CONTEXT_BYTES)


def estimate_7b(world_size: int, checkpointing: bool):
    batch = (torch.empty(MICRO_BATCH, SEQ, dtype=torch.long, device="meta"),) * 2
    return estimate_fsdp_step(llama_7b, batch, lm_loss, adamw, world_size=world_size, precision="bf16",
                              device="cuda", activation_checkpointing=checkpointing)


def table_7b(world_sizes: list[int], target_gib: float) -> dict[bool, int | None]:
    limit = usable_bytes(target_gib)
    with torch.device("meta"):
        params = sum(p.numel() for p in llama_7b().parameters())
    print(f"Llama-7B shape {LLAMA_7B} ({params / 1e9:.2f} B parameters), seq {SEQ}, micro-batch {MICRO_BATCH}, "
          f"bf16, AdamW; one rank's need (peak + cuBLAS workspaces) vs {limit / GIB:.2f} GiB usable of {target_gib:g} GiB")
    print(f"{'ranks':>6} {'checkpointing':>14} {'need GiB':>9} {'peak GiB':>9} {'fits':>5} {'s':>6}  peak at / breakdown")
    smallest: dict[bool, int | None] = {}
    for checkpointing in (False, True):
        needs: dict[int, int] = {}
        for n in world_sizes:
            started = time.perf_counter()
            estimate = estimate_7b(n, checkpointing)
            needs[n] = need_bytes(estimate)
            parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in estimate.detail.items() if v >= GIB // 100)
            print(f"{n:>6} {'yes' if checkpointing else 'no':>14} {needs[n] / GIB:>9.2f} {estimate.peak_bytes / GIB:>9.2f} "
                  f"{'yes' if needs[n] <= limit else 'no':>5} {time.perf_counter() - started:>6.1f}  "
                  f"{estimate.peak_at} / {parts} [{estimate.method}]", flush=True)
        fitting = [n for n in sorted(needs) if needs[n] <= limit]
        if fitting and (fitting[0] == 1 or fitting[0] // 2 in needs):
            smallest[checkpointing] = fitting[0]
        else:  # the table does not bracket it: double the ranks from its largest
            started = time.perf_counter()
            found, probes = smallest_world_size(lambda n, ac=checkpointing: need_bytes(estimate_7b(n, ac)), limit,
                                                start=max(needs))
            print(f"  searched {sorted(probes)} in {time.perf_counter() - started:.1f} s")
            smallest[checkpointing] = found
        print(f"smallest world size at {target_gib:g} GiB, activation checkpointing "
              f"{'on' if checkpointing else 'off'}: {smallest[checkpointing]}", flush=True)
    return smallest


def quick_verdict(target_gib: float, world_size: int = 8) -> int | None:
    """What ``trainer.strategy=fsdp preflight.memory.world_size=8 preflight.memory.target_gib=80``
    answers: one rank's need at 8 ranks, and the smallest world size (doubling from 1) that fits."""
    limit = usable_bytes(target_gib)
    started = time.perf_counter()
    need = need_bytes(estimate_7b(world_size, False))
    print(f"one rank of {world_size}: {need / GIB:.2f} GiB of {limit / GIB:.2f} GiB usable "
          f"({'fits' if need <= limit else 'does not fit'}) in {time.perf_counter() - started:.1f} s", flush=True)
    started = time.perf_counter()
    found, probes = smallest_world_size(lambda n: need_bytes(estimate_7b(n, False)), limit, start=0)
    print(f"smallest world size at {target_gib:g} GiB: {found} (probed "
          f"{', '.join(f'{n}: {v / GIB:.2f} GiB' for n, v in sorted(probes.items()))}) in "
          f"{time.perf_counter() - started:.1f} s")
    return found


def validation() -> list[float]:
    cases = validation_cases()
    estimates, errors = [], []
    for model_fn, batch, loss_fn, build, options in cases.values():
        started = time.perf_counter()
        estimates.append((estimate_fsdp_step(model_fn, batch, loss_fn, build, world_size=2, **options),
                          time.perf_counter() - started))
    started = time.perf_counter()
    measured = measure_fsdp_steps(list(cases.values()), world_size=2)
    print(f"measured on 2 gloo ranks in {time.perf_counter() - started:.1f} s (process start included)")
    for name, (estimate, seconds), ranks in zip(cases, estimates, measured):
        peak = max(rank.peak_bytes for rank in ranks)
        errors.append((estimate.peak_bytes - peak) / peak)
        print(f"{name:>22}: estimate {estimate.peak_bytes:>9} B ({seconds:.1f} s), measured per rank "
              f"{[rank.peak_bytes for rank in ranks]}, error {errors[-1]:+.2%}, peak at {estimate.peak_at}")
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="1,2,4,8,16")
    parser.add_argument("--target-gib", type=float, default=80.0)
    parser.add_argument("--no-validation", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="the verdict only: one rank of 8, and the smallest world size (doubling from 1)")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.quick:
        smallest = quick_verdict(args.target_gib)
        print(f"total {time.perf_counter() - started:.1f} s")
        print(f"fsdp_7b_smallest_world_size_{args.target_gib:g}gib={smallest}")
        return
    errors = [] if args.no_validation else validation()
    smallest = table_7b([int(n) for n in args.world_sizes.split(",")], args.target_gib)
    print(f"total {time.perf_counter() - started:.1f} s")
    if errors:
        print(f"largest estimate error: {max(abs(e) for e in errors):.2%}")
    print(f"fsdp_7b_smallest_world_size_{args.target_gib:g}gib={smallest[False]}")


if __name__ == "__main__":
    main()
