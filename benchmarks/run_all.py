"""`make bench`: run every benchmark and print one table of figure, value, target, verdict.

    python benchmarks/run_all.py [name ...]      # e.g. loop_overhead preflight_cost

Each benchmark is a script in this directory that prints its headline figure as its last
line, ``name=value``. Scripts run one after another (never in parallel: they time things)
and their full output goes to ``benchmarks/results/<script>.txt``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Benchmark:
    script: str
    target: str
    meets: Callable[[float], bool] | None
    args: tuple[str, ...] = ()


BENCHMARKS = (
    Benchmark("loop_overhead.py", "<= 1.02 (recipe / hand-written time per step)", lambda v: v <= 1.02),
    Benchmark("preflight_cost.py", "< 15 s (full default preflight)", lambda v: v < 15.0),
    Benchmark("memory_estimator.py", "< 10 s (7B two-step estimate)", lambda v: v < 10.0),
    Benchmark("checkpoint_io.py", "informational (checkpoint save / plain fsync'd write)", None),
    Benchmark("dynamics_cost.py", "<= 1.02 (dynamics every 50 steps / off)", lambda v: v <= 1.02),
)


def headline(output: str) -> tuple[str, float] | None:
    for line in reversed(output.strip().splitlines()):
        name, sep, value = line.strip().partition("=")
        if sep and name and " " not in name:
            try:
                return name, float(value)
            except ValueError:
                return None
    return None


def main() -> int:
    wanted = {name.removesuffix(".py") for name in sys.argv[1:]}
    results_dir = HERE / "results"
    results_dir.mkdir(exist_ok=True)
    rows = []
    for bench in BENCHMARKS:
        stem = bench.script.removesuffix(".py")
        if wanted and stem not in wanted:
            continue
        if not (HERE / bench.script).is_file():
            rows.append((stem, "-", bench.target, "missing"))
            continue
        print(f"running {bench.script} ...", flush=True)
        started = time.perf_counter()
        completed = subprocess.run([sys.executable, str(HERE / bench.script), *bench.args], capture_output=True, text=True)
        (results_dir / f"{stem}.txt").write_text(completed.stdout + completed.stderr)
        found = headline(completed.stdout) if completed.returncode == 0 else None
        if found is None:
            rows.append((stem, "error", bench.target, f"failed (exit {completed.returncode}, see results/{stem}.txt)"))
            continue
        name, value = found
        verdict = "info" if bench.meets is None else ("pass" if bench.meets(value) else "FAIL")
        rows.append((name, f"{value:.3f}", bench.target, f"{verdict}  ({time.perf_counter() - started:.0f} s)"))
    widths = [max(len(str(row[i])) for row in rows + [("figure", "value", "target", "result")]) for i in range(4)]
    print()
    for row in [("figure", "value", "target", "result"), *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)))
    return 1 if any(row[3].startswith(("FAIL", "failed")) for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
