"""Check set bj's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence,
both hand-written paraphrases in ``paraphrases.py``, and none of the generic warnings in
benchmarks/blind_preflight/patterns.py.

    .venv/bin/python -m benchmarks.blind_preflight_bj.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_bj.paraphrases import PARAPHRASES
from benchmarks.blind_preflight_bj.registry import load_all


def check_paraphrases(cases: dict) -> int:
    bad = 0
    broken = [n for n, c in cases.items() if not c.healthy]
    for name in broken:
        texts = PARAPHRASES.get(name, [])
        if len(texts) != 2:
            bad += 1
            print(f"{name}: expected 2 paraphrases, found {len(texts)}")
            continue
        pattern = re.compile(cases[name].cause_pattern, re.IGNORECASE)
        for t in texts:
            if not pattern.search(t):
                bad += 1
                print(f"{name}: paraphrase DOES NOT match: {t}")
    print(f"{len(broken) * 2 - bad}/{len(broken) * 2} paraphrases matched by their case's pattern")
    return 1 if bad else 0


if __name__ == "__main__":
    cases = load_all()
    sys.exit(check_patterns(cases) | check_paraphrases(cases))
