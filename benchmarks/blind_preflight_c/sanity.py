"""Sanity run (no preflight): 20 plain optimizer steps per case of set c, first vs last loss.

    .venv/bin/python -m benchmarks.blind_preflight_c.sanity [NAME ...]

Healthy cases must show DEC (the mean of the last 3 losses below the first 3); broken ones
are listed for reference (a NaN, a raise or no decrease is expected of some). The loop is
set a's (``benchmarks.blind_preflight.sanity``).
"""

from __future__ import annotations

import sys

from benchmarks.blind_preflight.sanity import main
from benchmarks.blind_preflight_c.registry import load_all

if __name__ == "__main__":
    main(sys.argv[1:], load_all())
