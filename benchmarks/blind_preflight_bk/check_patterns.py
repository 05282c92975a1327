"""Check set bk's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence,
both hand-written paraphrases in paraphrases.py, and none of the generic warnings in
benchmarks/blind_preflight/patterns.py.

    .venv/bin/python -m benchmarks.blind_preflight_bk.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_bk.paraphrases import PARAPHRASES
from benchmarks.blind_preflight_bk.registry import load_all


def check_paraphrases(cases: dict) -> int:
    bad = 0
    broken = [n for n, c in cases.items() if not c.healthy]
    for name in broken:
        texts = PARAPHRASES.get(name, [])
        pattern = re.compile(cases[name].cause_pattern, re.IGNORECASE)
        misses = [t for t in texts if not pattern.search(t)]
        if len(texts) != 2 or misses:
            bad += 1
            print(f"{name}: {len(texts)} paraphrases; not matched: {misses}")
    print(f"{len(broken) - bad}/{len(broken)} patterns match both of their paraphrases")
    return 1 if bad else 0


if __name__ == "__main__":
    cases = load_all()
    sys.exit(check_patterns(cases) | check_paraphrases(cases))
