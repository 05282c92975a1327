"""Facts behind set bh's broken cases, checked without the preflight: per case, the fact the bug rests on, then the
case trained next to its one-line fix (same data, same steps, set e's sanity loop) and both scored on the case's own
metric (held-out NLL per dimension / per token, reconstruction error; lower is better).

    .venv/bin/python -m benchmarks.blind_preflight_bh.verify [NAME ...]
"""

from __future__ import annotations

import sys
from functools import partial

from benchmarks.blind_preflight.fixes import verify
from benchmarks.blind_preflight_e.sanity import run_case
from benchmarks.blind_preflight_bh import facts  # noqa: F401  (attaches each case's fact to FIXES)
from benchmarks.blind_preflight_bh.registry import FIXES, load_all


def main(names: list[str]) -> None:
    verify(names, load_all(), FIXES, partial(run_case, bf16_autocast=True))


if __name__ == "__main__":
    main(sys.argv[1:])
