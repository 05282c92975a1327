"""Sanity run (no preflight): 20 plain optimizer steps per case of set d, first vs last loss.

    .venv/bin/python -m benchmarks.blind_preflight_d.sanity [--steps N] [NAME ...]

Like set a's loop, but it also does what the case passes to run_preflight: clip_grad_norm,
the scheduler (stepped after the optimizer) and accumulation_steps (loss / k per micro-batch).
Healthy cases must show DEC (the mean of the last 3 losses below the first 3); broken ones are
listed for reference (a NaN, a raise, no decrease, or a suspiciously fast decrease is expected).
"""

from __future__ import annotations

import math
import sys
import time
import warnings

import torch

from benchmarks.blind_preflight_d.registry import load_all
from optimus_preflight.preflight.standalone import loss_adapter


def run_case(case, steps: int = 20):
    kw = case.build()
    model, optimizer, train_loader = kw["model"], kw["optimizer"], kw["train_loader"]
    compute_loss = loss_adapter(kw.get("loss_fn"))
    scheduler, clip, accum = kw.get("scheduler"), kw.get("clip_grad_norm"), kw.get("accumulation_steps", 1)
    model.train()
    losses, batches = [], iter(train_loader)

    def next_batch():
        nonlocal batches
        try:
            return next(batches)
        except StopIteration:
            batches = iter(train_loader)
            return next(batches)

    for _ in range(steps):
        optimizer.zero_grad()
        total = 0.0
        for _ in range(accum):
            loss = compute_loss(model, next_batch())
            loss = loss[0] if isinstance(loss, tuple) else loss
            (loss / accum).backward()
            total += loss.item() / accum
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(total)
    return losses, model


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    steps = 20
    if argv[:1] == ["--steps"]:
        steps, argv = int(argv[1]), argv[2:]
    cases = load_all()
    for name in argv or list(cases):
        case = cases[name]
        start = time.time()
        kind = "H" if case.healthy else "B"
        try:
            losses, model = run_case(case, steps)
            first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
            verdict = "NaN" if not math.isfinite(last) else ("DEC" if last < first else "NOT-DEC")
            print(f"{name:48s} {kind} first {first:.4g} last {last:.4g} {verdict} train={model.training} "
                  f"{time.time() - start:.1f}s", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:48s} {kind} RAISED {type(e).__name__}: {str(e)[:150]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
