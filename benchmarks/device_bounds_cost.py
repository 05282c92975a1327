"""What the host-side index bounds (``framework/device_bounds.py``) add to the preflight.

    python benchmarks/device_bounds_cost.py                      # on CUDA when there is one
    python benchmarks/device_bounds_cost.py --repeat 3 recipe=char_lm_tiny

The default recipe's whole preflight, with and without ``HostBoundsGuard``, taking turns
(guarded, bare, guarded, ...) so that the machine's noise falls on both. Without CUDA the
guard is pointed at the CPU (where the preflight does not install it): an upper bound of its
Python cost, without the device synchronisations. The last line is
``guarded_s=... bare_s=... ratio=...`` (medians).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from optimus_preflight import compose
from optimus_preflight.cli import resolve_recipe_class
from optimus_preflight.preflight.framework import execution
from optimus_preflight.preflight.framework.device_bounds import HostBoundsGuard


def preflight_seconds(overrides: list[str], guard) -> float:
    cfg = compose([*overrides, "logging.progress=none", "preflight.overfit_steps=0"])
    recipe = resolve_recipe_class(cfg)(cfg, run_dir=Path(tempfile.mkdtemp(prefix="bounds-cost-")))
    recipe.setup()
    logging.getLogger("optimus_preflight").setLevel(logging.WARNING)
    original = execution.host_bounds_checked
    execution.host_bounds_checked = guard
    try:
        started = time.perf_counter()
        report = recipe.preflight()
        elapsed = time.perf_counter() - started
    finally:
        execution.host_bounds_checked = original
    if report.status != "passed":
        print(f"note: preflight status {report.status}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. recipe=char_lm_tiny")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    overrides = [*args.overrides, f"trainer.device={'cuda' if cuda else 'cpu'}"]
    if cuda:
        guarded = execution.host_bounds_checked
    else:
        def guarded(device, model):
            return HostBoundsGuard(("cpu",))
    bare = lambda device, model: contextlib.nullcontext()  # noqa: E731
    preflight_seconds(overrides, bare)  # warm-up: imports, allocator, kernels
    with_guard, without = [], []
    for _ in range(args.repeat):
        with_guard.append(preflight_seconds(overrides, guarded))
        without.append(preflight_seconds(overrides, bare))
    g, b = statistics.median(with_guard), statistics.median(without)
    where = torch.cuda.get_device_name() if cuda else "CPU (guard pointed at the CPU: Python cost only)"
    print(f"{where}; {args.repeat} pair(s); guarded {', '.join(f'{x:.2f}' for x in with_guard)} s; "
          f"bare {', '.join(f'{x:.2f}' for x in without)} s")
    print(f"guarded_s={g:.3f} bare_s={b:.3f} ratio={g / b:.3f}")


if __name__ == "__main__":
    main()
