"""Check set z's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence and
none of the generic warnings set k checks against (set a's ``benchmarks/blind_preflight/patterns.py``, imported as
set k's check does; it imports nothing from optimus_preflight).

    .venv/bin/python -m benchmarks.blind_preflight_z.check_patterns
"""

from __future__ import annotations

import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_z.registry import load_all

if __name__ == "__main__":
    sys.exit(check_patterns(load_all()))
