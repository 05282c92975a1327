"""Sanity run (no preflight): N plain optimizer steps per case of set h, first vs last loss.

    .venv/bin/python -m benchmarks.blind_preflight_h.sanity [--steps N] [NAME ...]

Set e's loop (written after benchmarks/blind_preflight_e/sanity.py: clip_grad_norm, the scheduler stepped after the optimizer,
accumulation_steps with loss / k per micro-batch, README's loss adapter) with one addition: ``precision="bf16"``
runs the forward and the loss under ``torch.autocast("cpu", dtype=torch.bfloat16)``, as a bf16 run does. Imports
nothing from optimus_preflight. Healthy cases must show DEC (the mean of the last 3 losses below the first 3);
broken ones are listed for reference.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import warnings

import torch

from torch import nn


def loss_of(loss_fn, model, batch):
    """README's adapter contract (as in set e's sanity.py): an nn loss module gets (model(inputs), targets), any other
    callable (model, batch), None means model(**batch).loss."""
    if loss_fn is None:
        return model(**batch).loss
    if isinstance(loss_fn, nn.Module):
        return loss_fn(model(batch[0]), batch[-1])
    out = loss_fn(model, batch)
    return out[0] if isinstance(out, tuple) else out


def run_case(case, steps: int = 20):
    kw = case.build()
    model, optimizer, train_loader = kw["model"], kw["optimizer"], kw["train_loader"]
    scheduler, clip, accum = kw.get("scheduler"), kw.get("clip_grad_norm"), kw.get("accumulation_steps", 1)
    bf16 = kw.get("precision", "fp32") == "bf16"
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
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
            with ctx:
                loss = loss_of(kw.get("loss_fn"), model, next_batch())
            (loss.float() / accum).backward()
            total += loss.item() / accum
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(total)
    return losses, model


def main(argv: list[str]) -> None:
    from benchmarks.blind_preflight_h.registry import load_all

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    steps = 200
    if argv[:1] == ["--steps"]:
        steps, argv = int(argv[1]), argv[2:]
    cases = load_all()
    names = argv or [n for n, c in cases.items() if c.healthy]
    ok = 0
    for name in names:
        case = cases[name]
        start = time.time()
        kind = "H" if case.healthy else "B"
        try:
            losses, model = run_case(case, steps)
            first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
            verdict = "NaN" if not math.isfinite(last) else ("DEC" if last < first else "NOT-DEC")
            ok += verdict == "DEC"
            print(f"{name:58s} {kind} first {first:.4g} last {last:.4g} {verdict} train={model.training} "
                  f"{time.time() - start:.1f}s", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:58s} {kind} RAISED {type(e).__name__}: {str(e)[:150]}", flush=True)
    print(f"\n{ok}/{len(names)} show DEC")


if __name__ == "__main__":
    main(sys.argv[1:])
