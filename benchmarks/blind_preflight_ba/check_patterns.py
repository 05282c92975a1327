"""Check set ba's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence and
none of the generic warnings below (what a checker says about a run without naming this set's causes).

    .venv/bin/python -m benchmarks.blind_preflight_ba.check_patterns
"""

from __future__ import annotations

import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_ba.registry import load_all

if __name__ == "__main__":
    sys.exit(check_patterns(load_all()))
