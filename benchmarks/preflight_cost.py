"""What the full default preflight costs: wall time in total, per check, and as a
multiple of one training step of the same recipe.

    python benchmarks/preflight_cost.py                 # the default recipe
    python benchmarks/preflight_cost.py recipe=char_lm_tiny --repeat 3

Each repetition builds a fresh recipe, runs the preflight right after setup (as a real
run does, so it pays the same warm-up costs), then times training steps (median of
``--steps`` after one warm-up step). The last line is ``preflight_s=<median seconds>``.
The overfit smoke is off (preflight.overfit_steps=0, the default).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

from optimus_preflight import compose
from optimus_preflight.cli import resolve_recipe_class


def measure(overrides: list[str], steps: int) -> tuple[float, dict[str, float], float]:
    cfg = compose([*overrides, "logging.progress=none", "preflight.overfit_steps=0"])
    recipe = resolve_recipe_class(cfg)(cfg, run_dir=Path(tempfile.mkdtemp(prefix="preflight-cost-")))
    recipe.setup()
    logging.getLogger("optimus_preflight").setLevel(logging.WARNING)  # setup() sets INFO
    started = time.perf_counter()
    report = recipe.preflight()
    total = time.perf_counter() - started
    if report.status != "passed":
        print(f"warning: preflight status {report.status}", file=sys.stderr)
    recipe.train_step()  # warm-up
    times = []
    for _ in range(steps):
        begin = time.perf_counter()
        recipe.train_step()
        times.append(time.perf_counter() - begin)
    return total, {check.name: check.elapsed_s for check in report.checks}, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. recipe=char_lm_tiny")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10, help="training steps timed for the per-step reference")
    args = parser.parse_args()
    runs = [measure(args.overrides, args.steps) for _ in range(args.repeat)]
    totals = [total for total, _, _ in runs]
    step_s = statistics.median(step for _, _, step in runs)
    per_check = {name: statistics.median(run[1][name] for run in runs) for name in runs[0][1]}
    print(f"recipe overrides: {' '.join(args.overrides) or '(default recipe)'}; {args.repeat} run(s)")
    print(f"{'check':<26} {'median s':>9} {'x step':>8}")
    for name, seconds in sorted(per_check.items(), key=lambda item: -item[1]):
        print(f"{name:<26} {seconds:9.4f} {seconds / step_s:8.2f}")
    total = statistics.median(totals)
    steps = [total_ / step_ for total_, _, step_ in runs]
    print(f"preflight total: median {total:.3f} s, min {min(totals):.3f} s (runs: {', '.join(f'{t:.3f}' for t in totals)})")
    print(f"one training step: median {step_s:.4f} s; preflight = {statistics.median(steps):.1f} training steps "
          f"(per run: {', '.join(f'{r:.1f}' for r in steps)})")
    print(f"preflight_s={total:.3f}")


if __name__ == "__main__":
    main()
