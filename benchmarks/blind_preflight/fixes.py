"""One-line fixes trained next to the broken cases (no preflight involved), for a set's ``verify.py``.

A set's registry keeps a ``FixTable``: per broken case, the builder of the fixed kwargs, the metric both runs are
scored on, and a function printing the fact the bug rests on. ``verify`` trains the broken case and its fix with the
same loop, steps and data, and passes a case when the broken run ends clearly worse: by at least 0.05 on a [0, 1]
metric, or by 10% of the fixed value otherwise.
"""

from __future__ import annotations

import math
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch


class FixTable:
    """name -> dict(fixed=builder of the fixed kwargs, metric=fn(model, kwargs) -> float, label=str, higher=bool,
    fact=fn() printing the fact the bug rests on, steps=int)."""

    def __init__(self) -> None:
        self.fixes: dict[str, dict[str, Any]] = {}

    def fix(self, name: str, fixed: Callable[[], dict], metric: Callable, label: str, fact: Callable | None = None,
            steps: int = 300, higher: bool = True) -> None:
        self.fixes[name] = dict(fixed=fixed, metric=metric, label=label, fact=fact, steps=steps, higher=higher)


@torch.no_grad()
def accuracy(model, batches, fwd=None) -> float:
    """fwd(model, batch) -> (predictions, targets); default: model(batch[0]).argmax(-1) vs batch[-1]."""
    was = model.training
    model.eval()
    right = n = 0
    for batch in batches:
        pred, y = fwd(model, batch) if fwd else (model(batch[0]).argmax(-1), batch[-1])
        keep = y != -100
        right += (pred[keep] == y[keep]).sum().item()
        n += keep.sum().item()
    model.train(was)
    return right / max(n, 1)


def val_acc(model, kw) -> float:
    return accuracy(model, kw["val_loader"])


def clearly_worse(broken: float, fixed: float, higher: bool) -> bool:
    if not math.isfinite(broken):
        return True
    gap = (fixed - broken) if higher else (broken - fixed)
    return gap >= max(0.05 if 0 <= fixed <= 1 else 0.0, 0.1 * abs(fixed))


def verify(names: list[str], cases: dict, fixes: dict[str, dict[str, Any]], run_case: Callable) -> None:
    """Train each broken case (all of them without ``names``) next to its fix with ``run_case(case, steps)``
    (a set's sanity loop) and print both losses, both metrics and the verdict."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    broken_names = [n for n, c in cases.items() if not c.healthy]
    missing = [n for n in broken_names if n not in fixes]
    if missing:
        print("no fix for:", missing)

    def train(build, steps):
        built = {}

        class Built:  # a Case-like wrapper for run_case
            @staticmethod
            def build():
                built["kw"] = build()
                return built["kw"]
        losses, model = run_case(Built, steps)
        return sum(losses[:3]) / 3, sum(losses[-10:]) / 10, model, built["kw"]

    results = {}
    for name in names or broken_names:
        spec = fixes[name]
        print(name, flush=True)
        start = time.time()
        try:
            if spec["fact"]:
                torch.manual_seed(0)
                spec["fact"]()
            b0, b1, bm, bkw = train(cases[name].build, spec["steps"])
            f0, f1, fm, fkw = train(spec["fixed"], spec["steps"])
            torch.manual_seed(0)
            mb, mf = spec["metric"](bm, bkw), spec["metric"](fm, fkw)
            ok = clearly_worse(mb, mf, spec["higher"])
            results[name] = ok
            print(f"  broken loss {b0:.4g} -> {b1:.4g}; fixed loss {f0:.4g} -> {f1:.4g} ({spec['steps']} steps) | "
                  f"{spec['label']}: broken {mb:.3f}, fixed {mf:.3f} -> {'PASS' if ok else 'FAIL'} "
                  f"({time.time() - start:.0f}s)", flush=True)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            results[name] = False
            print(f"  RAISED {type(e).__name__}: {str(e)[:200]}")
    passed = sum(results.values())
    print(f"\n{passed}/{len(results)} broken cases end clearly worse than their fix")
    failed = [n for n, ok in results.items() if not ok]
    if failed:
        print("not worse:", ", ".join(failed))
