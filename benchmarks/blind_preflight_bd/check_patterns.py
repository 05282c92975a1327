"""Check set bd's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence and
both hand-written paraphrases of a correct diagnosis (paraphrases.py), and none of the generic warnings set a's
check lists (what a checker says about a run without naming this set's causes).

    .venv/bin/python -m benchmarks.blind_preflight_bd.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_bd.paraphrases import PARAPHRASES
from benchmarks.blind_preflight_bd.registry import load_all


def check_paraphrases(cases) -> int:
    bad = 0
    for name, c in cases.items():
        if c.healthy:
            continue
        texts = PARAPHRASES.get(name, [])
        if len(texts) < 2:
            print(f"{name}: fewer than 2 paraphrases")
            bad += 1
        for text in texts:
            if not re.search(c.cause_pattern, text, re.IGNORECASE):
                print(f"{name}: pattern misses paraphrase: {text[:100]}")
                bad += 1
    n = sum(not c.healthy for c in cases.values())
    print(f"paraphrases: {2 * n - bad}/{2 * n} matched")
    return bad


if __name__ == "__main__":
    cases = load_all()
    rc = check_patterns(cases)
    bad = check_paraphrases(cases)
    sys.exit(1 if (rc or bad) else 0)
