"""Check set bi's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence,
both hand-written paraphrases in ``paraphrases.py``, and none of the generic warnings.

    .venv/bin/python -m benchmarks.blind_preflight_bi.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_bi.paraphrases import PARAPHRASES
from benchmarks.blind_preflight_bi.registry import load_all


def check_paraphrases(cases: dict) -> int:
    bad = 0
    for name, c in cases.items():
        if c.healthy:
            continue
        texts = PARAPHRASES.get(name, [])
        pattern = re.compile(c.cause_pattern, re.IGNORECASE)
        misses = [t for t in texts if not pattern.search(t)]
        if len(texts) != 2 or misses:
            bad += 1
            print(f"{name}: {len(texts)} paraphrases; missed: {misses}")
    n = sum(not c.healthy for c in cases.values())
    print(f"{n - bad}/{n} patterns match both paraphrases")
    return 1 if bad else 0


if __name__ == "__main__":
    cases = load_all()
    sys.exit(check_patterns(cases) | check_paraphrases(cases))
