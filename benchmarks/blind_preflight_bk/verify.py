"""Facts behind set bk's broken cases, checked without the preflight: per case, the fact the bug rests on, then the
case trained next to its one-line fix (same data, same steps, same loop: set e's sanity loop, with its bf16 autocast
for a case that asks for bf16; none here does) and both scored on the case's own metric (relative L2 error in percent
against the analytic / simulated field, or rollout RMSE against simulated trajectories).

    .venv/bin/python -m benchmarks.blind_preflight_bk.verify [NAME ...]

A case passes when the broken run ends clearly worse than the fixed one (by 10% of the fixed value for these
metrics, or 0.05 on a [0, 1] value).
"""

from __future__ import annotations

import sys
from functools import partial

from benchmarks.blind_preflight.fixes import verify
from benchmarks.blind_preflight_bk import facts  # noqa: F401  (attaches each case's fact to FIXES)
from benchmarks.blind_preflight_bk.registry import FIXES, load_all
from benchmarks.blind_preflight_e.sanity import run_case


def main(names: list[str]) -> None:
    verify(names, load_all(), FIXES, partial(run_case, bf16_autocast=True))


if __name__ == "__main__":
    main(sys.argv[1:])
