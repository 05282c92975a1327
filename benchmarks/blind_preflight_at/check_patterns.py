"""Check set at's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence and
none of the generic warnings (set a's shared list in benchmarks/blind_preflight/patterns.py, as set k uses it).

    .venv/bin/python -m benchmarks.blind_preflight_at.check_patterns
"""

from __future__ import annotations

import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_at.registry import load_all

if __name__ == "__main__":
    sys.exit(check_patterns(load_all()))
