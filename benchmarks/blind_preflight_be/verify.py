"""Facts behind set be's broken cases, checked without the preflight: the case trained next to its one-line fix
(same data, steps and loop: set e's sanity loop with its bf16 autocast) and both scored on the case's own metric.

    .venv/bin/python -m benchmarks.blind_preflight_be.verify [NAME ...]
"""

from __future__ import annotations

import sys
from functools import partial

from benchmarks.blind_preflight.fixes import verify
from benchmarks.blind_preflight_be import facts  # noqa: F401
from benchmarks.blind_preflight_be.registry import FIXES, load_all
from benchmarks.blind_preflight_e.sanity import run_case


def main(names: list[str]) -> None:
    verify(names, load_all(), FIXES, partial(run_case, bf16_autocast=True))


if __name__ == "__main__":
    main(sys.argv[1:])
