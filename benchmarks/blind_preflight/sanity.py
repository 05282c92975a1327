"""Sanity run (no preflight): 20 plain optimizer steps per case, first vs last loss.

    .venv/bin/python -m benchmarks.blind_preflight.sanity [NAME ...]

Healthy cases must show DEC (the mean of the last 3 losses below the first 3); broken ones
are listed for reference (a NaN, a raise or no decrease is expected of some).
"""

from __future__ import annotations

import sys
import time
import warnings

import torch

from benchmarks.blind_preflight.registry import load_all
from optimus_preflight.preflight.standalone import loss_adapter


def main(names: list[str], cases: dict | None = None) -> None:
    """``cases``: another set's registry (``load_all()`` of set c); default set a's."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    cases = cases if cases is not None else load_all()
    for name in names or list(cases):
        case = cases[name]
        start = time.time()
        kind = "H" if case.healthy else "B"
        try:
            kw = case.build()
            model, optimizer, train_loader = kw["model"], kw["optimizer"], kw["train_loader"]
            compute_loss = loss_adapter(kw.get("loss_fn"))
            losses, batches = [], iter(train_loader)
            for _ in range(20):
                try:
                    batch = next(batches)
                except StopIteration:
                    batches = iter(train_loader)
                    batch = next(batches)
                optimizer.zero_grad()
                loss = compute_loss(model, batch)
                loss = loss[0] if isinstance(loss, tuple) else loss
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
            verdict = "DEC" if last < first else "NOT-DEC"
            print(f"{name:44s} {kind} first {first:.4g} last {last:.4g} {verdict} train={model.training} "
                  f"{time.time() - start:.1f}s", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:44s} {kind} RAISED {type(e).__name__}: {str(e)[:150]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
