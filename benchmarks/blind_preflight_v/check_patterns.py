"""Check set v's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence and
none of the generic warnings set k checks against (what a checker says about a run without naming this set's causes).

    .venv/bin/python -m benchmarks.blind_preflight_v.check_patterns
"""

from __future__ import annotations

import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_v.registry import load_all

if __name__ == "__main__":
    code = check_patterns(load_all())
    assert not any(m.startswith("optimus_preflight") for m in sys.modules), "optimus_preflight was imported"
    sys.exit(code)
