"""`make bench`: run every benchmark and print one table: figure, measured value, goal, verdict.

    python benchmarks/run_all.py [name ...]      # e.g. loop_overhead peer_lightning

Each benchmark is a script in this directory that prints its figures as ``name=value``
pairs, several to a line or one a line, on its last lines (a line holding anything
else is not read). A figure ``name`` may come with ``name_min`` and ``name_max``: the
spread over the script's rounds, shown as ``median (min-max)``. A script that cannot
measure on this checkout (e.g. no ``trainer.compile``, no Lightning) prints a line
starting ``skipped:`` and its figures show as skipped. A figure missing from a script's
output shows as ``n/a``.

Scripts run one after another (never in parallel: they time things) and their full
output goes to ``benchmarks/results/<script>.txt``. Exit status 1 when a figure misses
its goal or a script fails.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent

Spread = tuple[float, float | None, float | None]  # median, min, max


@dataclass(frozen=True)
class Figure:
    label: str
    names: tuple[str, ...]  # the name=value key, then older spellings of it
    goal: str
    meets: Callable[[float], bool] | None  # None: informational
    # For scripts that print the spread only as text: output -> (median, min, max) or None.
    from_text: Callable[[str], Spread | None] | None = None


@dataclass(frozen=True)
class Benchmark:
    script: str
    figures: tuple[Figure, ...]
    args: tuple[str, ...] = field(default=())


def per_round_list(pattern: str) -> Callable[[str], Spread | None]:
    """The median, min and max of a bracketed or comma-separated list of numbers that
    ``pattern``'s first group captures."""

    def extract(output: str) -> Spread | None:
        found = re.search(pattern, output)
        if not found:
            return None
        values = sorted(float(v) for v in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", found.group(1)))
        if not values:
            return None
        middle = len(values) // 2
        median = values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2
        return median, values[0], values[-1]

    return extract


BENCHMARKS = (
    Benchmark("loop_overhead.py", (
        Figure("recipe / hand-written loop, time per step", ("overhead_ratio",), "<= 1.02", lambda v: v <= 1.02,
               per_round_list(r"steady-state ratio per round: \[([^\]]*)\]")),
    )),
    Benchmark("peer_lightning.py", (
        Figure("recipe / Lightning, time per step", ("lightning_step_ratio",), "< 1.0", lambda v: v < 1.0),
        Figure("recipe / Lightning, whole run", ("lightning_run_ratio",),
               "info (includes our preflight; Lightning has none)", None),
    )),
    Benchmark("compile_speed.py", (
        Figure("recipe compiled / eager, time per step", ("compile_speedup_ratio",),
               "info (< 1.0 = faster; judge on a GPU)", None),
        Figure("recipe / hand-written loop, both compiled", ("compile_vs_hand_ratio",), "<= 1.02", lambda v: v <= 1.02),
    )),
    Benchmark("checkpoint_io.py", (
        Figure("async save: training blocked / sync save", ("async_blocked_ratio", "checkpoint_async_blocked_ratio"),
               "<= 0.1", lambda v: v <= 0.1),
        Figure("save throughput / plain write", ("save_vs_plain_write_ratio", "checkpoint_save_throughput_ratio"),
               ">= 0.5", lambda v: v >= 0.5),
    )),
    Benchmark("preflight_cost.py", (
        Figure("preflight time, in training steps", ("preflight_steps",), "info", None,
               per_round_list(r"preflight = [\d.]+ training steps \(per run: ([^)]*)\)")),
        Figure("preflight time, seconds", ("preflight_s",), "< 15 s", lambda v: v < 15.0,
               per_round_list(r"preflight total: .*\(runs: ([^)]*)\)")),
    ), args=("--repeat", "3")),
    Benchmark("memory_estimator.py", (
        Figure("7B two-step memory estimate, seconds", ("memory_7b_estimate_s",), "< 10 s", lambda v: v < 10.0),
    )),
    Benchmark("dynamics_cost.py", (
        Figure("dynamics every 50 steps / off, per step", ("dynamics_overhead_ratio",), "<= 1.02", lambda v: v <= 1.02),
    )),
)

PAIR = re.compile(r"^([A-Za-z_][\w.]*)=(\S+)$")


def name_values(output: str) -> dict[str, str]:
    """Every ``name=value`` from lines made only of such pairs; a later one wins."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        tokens = line.replace(",", " ").split()
        pairs = [PAIR.match(token) for token in tokens]
        if tokens and all(pairs):
            found.update(pair.groups() for pair in pairs)  # type: ignore[union-attr]
    return found


def as_float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def measured(figure: Figure, output: str, pairs: dict[str, str]) -> Spread | None:
    for name in figure.names:
        median = as_float(pairs.get(name))
        if median is not None:
            low, high = as_float(pairs.get(f"{name}_min")), as_float(pairs.get(f"{name}_max"))
            if (low is None or high is None) and figure.from_text:
                text = figure.from_text(output)
                if text is not None:
                    low, high = text[1], text[2]
            return median, low, high
    return figure.from_text(output) if figure.from_text else None


def fmt(value: float) -> str:
    return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"


def show(spread: Spread) -> str:
    median, low, high = spread
    if low is None or high is None or low == high == median:
        return fmt(median)
    return f"{fmt(median)} ({fmt(low)}-{fmt(high)})"


def run(bench: Benchmark, results_dir: Path) -> tuple[list[tuple[str, str, str, str]], str]:
    stem = bench.script.removesuffix(".py")
    if not (HERE / bench.script).is_file():
        return [(f.label, "-", f.goal, f"missing ({bench.script})") for f in bench.figures], "missing"
    print(f"running {bench.script} ...", flush=True)
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, str(HERE / bench.script), *bench.args], capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    output = completed.stdout
    (results_dir / f"{stem}.txt").write_text(completed.stdout + completed.stderr)
    runtime = f"{elapsed:.0f} s"
    print(f"  {stem}: {runtime}, exit {completed.returncode}", flush=True)
    if completed.returncode != 0:
        return [(f.label, "error", f.goal, f"failed (exit {completed.returncode}, see results/{stem}.txt)") for f in bench.figures], runtime
    skipped = next((line.strip() for line in output.splitlines() if line.startswith("skipped:")), None)
    pairs = name_values(output)
    rows = []
    for figure in bench.figures:
        spread = measured(figure, output, pairs)
        if spread is None:
            rows.append((figure.label, "n/a", figure.goal, skipped or f"n/a ({figure.names[0]} not in the output)"))
            continue
        verdict = "info" if figure.meets is None else ("pass" if figure.meets(spread[0]) else "FAIL")
        rows.append((figure.label, show(spread), figure.goal, verdict))
    return rows, runtime


def main() -> int:
    wanted = {name.removesuffix(".py") for name in sys.argv[1:]}
    results_dir = HERE / "results"
    results_dir.mkdir(exist_ok=True)
    rows: list[tuple[str, str, str, str]] = []
    runtimes = []
    for bench in BENCHMARKS:
        stem = bench.script.removesuffix(".py")
        if wanted and stem not in wanted:
            continue
        bench_rows, runtime = run(bench, results_dir)
        rows += bench_rows
        runtimes.append(f"{stem} {runtime}")
    header = ("figure", "measured: median (min-max)", "goal", "verdict")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    print()
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print(f"\nscript runtimes: {', '.join(runtimes)}; full outputs in benchmarks/results/")
    return 1 if any(row[3].startswith(("FAIL", "failed")) for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
