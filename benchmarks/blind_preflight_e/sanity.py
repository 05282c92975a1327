"""Sanity run (no preflight): N plain optimizer steps per case of set e, first vs last loss.

    .venv/bin/python -m benchmarks.blind_preflight_e.sanity [--steps N] [NAME ...]

Set d's loop (clip_grad_norm, the scheduler stepped after the optimizer, accumulation_steps with
loss / k per micro-batch), with its own loss adapter written from README's run_preflight contract:
an ``nn`` loss module is called as ``loss_fn(model(inputs), targets)``, any other callable as
``loss_fn(model, batch)``, and ``None`` means ``model(**batch).loss``. Healthy cases must show DEC
(the mean of the last 3 losses below the first 3); broken ones are listed for reference.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import warnings

import torch
from torch import nn

from benchmarks.blind_preflight_e.registry import load_all


def loss_of(loss_fn, model, batch):
    if loss_fn is None:
        return model(**batch).loss
    if isinstance(loss_fn, nn.Module):
        inputs, targets = batch[0], batch[-1]
        return loss_fn(model(inputs), targets)
    out = loss_fn(model, batch)
    return out[0] if isinstance(out, tuple) else out


def run_case(case, steps: int = 20, bf16_autocast: bool = False):
    """``bf16_autocast``: a case with ``precision="bf16"`` runs its forward and loss under CPU bf16 autocast, as a bf16
    run does (set h's sanity and verify; the earlier sets ran without it)."""
    kw = case.build()
    model, optimizer, train_loader = kw["model"], kw["optimizer"], kw["train_loader"]
    scheduler, clip, accum = kw.get("scheduler"), kw.get("clip_grad_norm"), kw.get("accumulation_steps", 1)
    bf16 = bf16_autocast and kw.get("precision", "fp32") == "bf16"
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
            with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
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


def main(argv: list[str], load=load_all, steps: int = 20, healthy_only: bool = False,
         bf16_autocast: bool = False) -> None:
    """``steps``: the default when ``--steps`` is not given; ``healthy_only``: without names, run the healthy cases
    only and count those that show DEC."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    if argv[:1] == ["--steps"]:
        steps, argv = int(argv[1]), argv[2:]
    cases = load()
    names = argv or [n for n, c in cases.items() if c.healthy or not healthy_only]
    width = max(52, *(len(name) for name in names))
    decreased = 0
    for name in names:
        case = cases[name]
        start = time.time()
        kind = "H" if case.healthy else "B"
        try:
            losses, model = run_case(case, steps, bf16_autocast)
            first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
            verdict = "NaN" if not math.isfinite(last) else ("DEC" if last < first else "NOT-DEC")
            decreased += verdict == "DEC"
            print(f"{name:{width}s} {kind} first {first:.4g} last {last:.4g} {verdict} train={model.training} "
                  f"{time.time() - start:.1f}s", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:{width}s} {kind} RAISED {type(e).__name__}: {str(e)[:150]}", flush=True)
    if healthy_only:
        print(f"\n{decreased}/{len(names)} show DEC")


if __name__ == "__main__":
    main(sys.argv[1:])
