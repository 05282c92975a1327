"""Check set bg's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence,
both hand-written paraphrases of a correct diagnosis (paraphrases.py), and none of the generic warnings of
benchmarks/blind_preflight/patterns.py.

    .venv/bin/python -m benchmarks.blind_preflight_bg.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_bg.paraphrases import PARAPHRASES
from benchmarks.blind_preflight_bg.registry import load_all


def main() -> int:
    cases = load_all()
    rc = check_patterns(cases)
    bad = 0
    for name, c in cases.items():
        if c.healthy:
            continue
        texts = PARAPHRASES.get(name, [])
        if len(texts) != 2:
            bad += 1
            print(f"{name}: {len(texts)} paraphrases (need 2)")
            continue
        for t in texts:
            if not re.search(c.cause_pattern, t, re.IGNORECASE):
                bad += 1
                print(f"{name}: paraphrase DOES NOT match: {t}")
    n = sum(not c.healthy for c in cases.values())
    print(f"paraphrases: {2 * n - bad}/{2 * n} match their case's pattern")
    return 1 if (rc or bad) else 0


if __name__ == "__main__":
    sys.exit(main())
