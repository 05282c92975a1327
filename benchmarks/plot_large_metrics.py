"""How long `optimus-plot` takes on a long run: a generated metrics.jsonl of N step
records (default 400k, the size of a long run logged every step) with evaluations,
memory and timing keys, a loss spike, and a few damaged lines a crash can leave.

    .venv/bin/python benchmarks/plot_large_metrics.py [--records 400000] [--timeout 600]

Prints the wall time of one `optimus-plot` process (what a user waits for) and its exit
code; the run dir is left in a temporary directory for inspection (--keep).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_metrics(path: Path, records: int, seed: int = 0, damaged: bool = True) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as out:
        for step in range(1, records + 1):
            loss = 4.0 * math.exp(-step / (records / 5)) + 0.5 + rng.gauss(0, 0.05)
            if step == records // 2:
                loss = 50.0  # a spike the plot must still show
            record = {"step": step, "epoch": step // 10_000, "loss": round(loss, 5), "lr": 3e-4,
                      "grad_norm": round(abs(rng.gauss(1, 0.2)), 4), "skipped_steps": 0,
                      "samples_per_s": round(rng.uniform(900, 1100), 1), "time/data_s": 0.001,
                      "time/step_s": 0.01, "memory/allocated_gib": 1.25}
            out.write(json.dumps(record) + "\n")
            if step % 1000 == 0:
                out.write(json.dumps({"step": step, "epoch": step // 10_000, "val_loss": round(loss, 5)}) + "\n")
        if not damaged:
            return
        # What a crash or another writer can leave: each must be skipped and counted.
        out.write('{"step": 17, "loss": 1.0, "lr": 0.1, \xff}\n'.encode("latin-1").decode("utf-8", "replace"))
        out.write('[1, 2, 3]\n"a string"\n{"step": 5, "loss": "abc"}\n{"step": 6, "loss": [1, 2]}\n')
        out.write('{"step": 7, "loss": ' + "9" * 5_000_000 + "}\n")
        out.write('{"step": 8, "lo')  # cut short by a kill


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--clean", action="store_true", help="no damaged lines (the old reader stops at the first)")
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="optimus-plot-bench-"))
    write_metrics(run_dir / "metrics.jsonl", args.records, damaged=not args.clean)
    if not args.clean:
        with (run_dir / "metrics.jsonl").open("ab") as out:
            out.write(b'\n{"step": 9, "loss": 1.0, "note": "\xff\xfe"}\n')  # not UTF-8
    size_mb = (run_dir / "metrics.jsonl").stat().st_size / 1e6
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "optimus_preflight.plotting.plot_cli", str(run_dir)],
                              capture_output=True, text=True, timeout=args.timeout)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        code, output = None, f"still running after {args.timeout:.0f} s (killed)"
    elapsed = time.perf_counter() - started
    print(f"{args.records} records ({size_mb:.0f} MB): optimus-plot exit {code} after {elapsed:.1f} s")
    print(output.strip().splitlines()[-1] if output.strip() else "")
    print("\n".join(output.strip().splitlines()[:3]))
    if args.keep:
        print(f"run dir: {run_dir}")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
