"""``optimus-plot RUN_DIR_OR_SWEEP_DIR``: PNG plots written next to the data.

A run gets ``<run>/plots/*.png``; a sweep gets ``<sweep>/plots/*.png`` with every job
on shared axes, plus final loss against each swept parameter. Exit 2 (one line on
stderr) when matplotlib is missing or the path holds no metrics.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MISSING_MATPLOTLIB = (
    "optimus-plot: error: matplotlib is not installed. Install it with `pip install matplotlib` "
    "(or the extra: pip install 'optimus-preflight[plot]')."
)


# --help is read in a terminal: plain text here, not the module docstring's reST markup
DESCRIPTION = "Draw a run's or a sweep's metrics.jsonl curves as PNG files."
EPILOG = """\
A run dir (one holding metrics.jsonl) gets PATH/plots/*.png: one PNG per metric with
data (loss, learning rate, gradient norm, GradScaler scale, update/weight ratio, dead
activations), one PNG per metric the recipe logs itself with self.log (its train, val
and test values on one panel; at most 12 such panels) and overview.png with all of them.

A sweep dir (runs below it, as optimus-train -m writes them) gets every job on shared
axes, labelled by its swept overrides, plus final loss against each swept parameter.

Exit codes: 0 plots written, 2 matplotlib missing or no metrics under PATH.

examples:
  optimus-plot outputs/2024-05-01/12-00-00
  optimus-plot multirun/2024-05-01/12-00-00 --out /tmp/sweep_plots
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="optimus-plot", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("path", type=Path, help="a run dir (with metrics.jsonl) or a sweep dir (runs below it)")
    parser.add_argument("--out", type=Path, default=None, help="where to write the PNGs (default: PATH/plots)")
    return parser.parse_args(argv)


def fail(message: str) -> int:
    print(f"optimus-plot: error: {message}", file=sys.stderr)
    return 2


def run(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        from optimus_preflight.plotting.figures import plot_run, plot_sweep
    except ImportError:
        print(MISSING_MATPLOTLIB, file=sys.stderr)
        return 2
    from optimus_preflight.plotting.runs import find_runs

    path: Path = args.path
    if not path.is_dir():
        return fail(f"{path} is not a directory. Pass a run dir (outputs/<date>/<time>) or a sweep dir (multirun/<date>/<time>).")
    kind, runs = find_runs(path)
    for damaged in (run for run in runs if run.skipped):
        # A crash, a full disk or another writer can leave such lines; the rest still plots.
        print(f"optimus-plot: skipped {damaged.skipped} line(s) of {damaged.path / 'metrics.jsonl'} that are not "
              "metric records (not UTF-8, not a JSON object, cut short, or a step that is not a number)", file=sys.stderr)
    runs = [run for run in runs if run.records]
    if not runs:
        return fail(f"no metrics.jsonl with records in or below {path}. Pass the run dir a training run wrote (it holds metrics.jsonl).")
    out_dir = args.out or path / "plots"
    written = plot_run(runs[0], out_dir) if kind == "run" else plot_sweep(runs, out_dir)
    what = "run" if kind == "run" else f"sweep of {len(runs)} runs"
    print(f"optimus-plot: {len(written)} plots of the {what} in {path}:")
    for file in written:
        print(f"  {file}")
    return 0


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
