"""Check set bc's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence
and none of the generic warnings (set a's ``check_patterns``), and both of its hand-written paraphrases
(``paraphrases.py``).

    .venv/bin/python -m benchmarks.blind_preflight_bc.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_bc.paraphrases import PARAPHRASES
from benchmarks.blind_preflight_bc.registry import load_all


def check_paraphrases(cases) -> int:
    bad = 0
    for name, c in cases.items():
        if c.healthy:
            continue
        texts = PARAPHRASES.get(name, [])
        if len(texts) < 2:
            print(f"{name}: fewer than two paraphrases")
            bad += 1
        for t in texts:
            if not re.search(c.cause_pattern, t, re.IGNORECASE):
                print(f"{name}: paraphrase not matched: {t}")
                bad += 1
    n = sum(1 for c in cases.values() if not c.healthy)
    print(f"paraphrases: {n - bad if bad <= n else 0}/{n} cases, {bad} misses")
    return bad


if __name__ == "__main__":
    cases = load_all()
    rc = check_patterns(cases)
    bad = check_paraphrases(cases)
    sys.exit(1 if (rc or bad) else 0)
