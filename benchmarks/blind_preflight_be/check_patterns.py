"""Check set be's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence and
none of set a's generic warnings (benchmarks/blind_preflight/patterns.py), and both of its paraphrases
(paraphrases.py).

    .venv/bin/python -m benchmarks.blind_preflight_be.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_be.paraphrases import PARAPHRASES
from benchmarks.blind_preflight_be.registry import load_all


def check_paraphrases(cases) -> int:
    bad = 0
    for name, case in cases.items():
        if case.healthy:
            continue
        texts = PARAPHRASES.get(name, [])
        if len(texts) != 2:
            print(f"{name}: needs 2 paraphrases, has {len(texts)}")
            bad += 1
        for text in texts:
            if not re.search(case.cause_pattern, text, re.I | re.S):
                print(f"{name}: pattern misses paraphrase: {text}")
                bad += 1
    print(f"paraphrases: {bad} misses")
    return bad


if __name__ == "__main__":
    cases = load_all()
    rc = check_patterns(cases)
    sys.exit(1 if (rc or check_paraphrases(cases)) else 0)
