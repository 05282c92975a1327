"""Facts behind set h's broken cases, checked without the preflight: per case, the fact the bug rests on, then the
case trained next to its one-line fix (same data, same steps, same loop: this set's sanity loop) and both scored on
the case's own metric (validation accuracy, IoU, RMSE, pixel error, ...).

    .venv/bin/python -m benchmarks.blind_preflight_h.verify [NAME ...]

A case passes when the broken run ends clearly worse than the fixed one (by at least 0.05 on a [0, 1] metric, or by
10% of the fixed value otherwise).
"""

from __future__ import annotations

import math
import sys
import time
import warnings

import torch

from benchmarks.blind_preflight_h.registry import FIXES, load_all
from benchmarks.blind_preflight_h.sanity import run_case


def train(build, steps):
    built = {}

    class C:  # a Case-like wrapper for sanity.run_case
        @staticmethod
        def build():
            built["kw"] = build()
            return built["kw"]
    losses, model = run_case(C, steps)
    return sum(losses[:3]) / 3, sum(losses[-10:]) / 10, model, built["kw"]


def clearly_worse(broken, fixed, higher):
    if not math.isfinite(broken):
        return True
    gap = (fixed - broken) if higher else (broken - fixed)
    return gap >= max(0.05 if 0 <= fixed <= 1 else 0.0, 0.1 * abs(fixed))


def main(names):
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    cases = load_all()
    broken_names = [n for n, c in cases.items() if not c.healthy]
    missing = [n for n in broken_names if n not in FIXES]
    if missing:
        print("no fix for:", missing)
    results = {}
    for name in names or broken_names:
        spec = FIXES[name]
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
            import traceback
            traceback.print_exc()
            results[name] = False
            print(f"  RAISED {type(e).__name__}: {str(e)[:200]}")
    passed = sum(results.values())
    print(f"\n{passed}/{len(results)} broken cases end clearly worse than their fix")
    failed = [n for n, ok in results.items() if not ok]
    if failed:
        print("not worse:", ", ".join(failed))


if __name__ == "__main__":
    main(sys.argv[1:])
