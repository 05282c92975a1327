"""Sanity run (no preflight): N plain optimizer steps per case of set e, first vs last loss.

    .venv/bin/python -m benchmarks.blind_preflight_e.sanity [--steps N] [NAME ...]

Set d's loop (clip_grad_norm, the scheduler stepped after the optimizer, accumulation_steps with
loss / k per micro-batch), with its own loss adapter written from README's run_preflight contract:
an ``nn`` loss module is called as ``loss_fn(model(inputs), targets)``, any other callable as
``loss_fn(model, batch)``, and ``None`` means ``model(**batch).loss``. Healthy cases must show DEC
(the mean of the last 3 losses below the first 3); broken ones are listed for reference.
"""

from __future__ import annotations

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


def run_case(case, steps: int = 20):
    kw = case.build()
    model, optimizer, train_loader = kw["model"], kw["optimizer"], kw["train_loader"]
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
            loss = loss_of(kw.get("loss_fn"), model, next_batch())
            (loss / accum).backward()
            total += loss.item() / accum
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(total)
    return losses, model


def main(argv: list[str], load=load_all) -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    steps = 20
    if argv[:1] == ["--steps"]:
        steps, argv = int(argv[1]), argv[2:]
    cases = load()
    for name in argv or list(cases):
        case = cases[name]
        start = time.time()
        kind = "H" if case.healthy else "B"
        try:
            losses, model = run_case(case, steps)
            first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
            verdict = "NaN" if not math.isfinite(last) else ("DEC" if last < first else "NOT-DEC")
            print(f"{name:52s} {kind} first {first:.4g} last {last:.4g} {verdict} train={model.training} "
                  f"{time.time() - start:.1f}s", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:52s} {kind} RAISED {type(e).__name__}: {str(e)[:150]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
