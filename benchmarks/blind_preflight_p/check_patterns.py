"""Check set p's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence, both
hand-written paraphrases of a correct diagnosis (registry.META), and none of set a's 60 generic warnings
(benchmarks/blind_preflight/patterns.py: what a checker says about a run without naming this set's causes).

    .venv/bin/python -m benchmarks.blind_preflight_p.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import GENERIC_WARNINGS, check_patterns
from benchmarks.blind_preflight_p.registry import META, load_all


def check_paraphrases(cases: dict) -> int:
    bad = 0
    for name, c in cases.items():
        if c.healthy:
            continue
        pattern = re.compile(c.cause_pattern, re.IGNORECASE)
        missed = [p for p in META[name]["paraphrases"] if not pattern.search(p)]
        if missed:
            bad += 1
            print(f"{name}: paraphrases not matched: {missed}")
    n = sum(not c.healthy for c in cases.values())
    print(f"{n - bad}/{n} patterns match both hand-written paraphrases of a correct diagnosis")
    return 1 if bad else 0


if __name__ == "__main__":
    cases = load_all()
    assert len(GENERIC_WARNINGS) == 60
    sys.exit(check_patterns(cases) | check_paraphrases(cases))
