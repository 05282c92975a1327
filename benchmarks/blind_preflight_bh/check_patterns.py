"""Check set bh's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence,
both hand-written paraphrases in paraphrases.py, and none of the generic warnings.

    .venv/bin/python -m benchmarks.blind_preflight_bh.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_bh.paraphrases import PARAPHRASES
from benchmarks.blind_preflight_bh.registry import load_all


def main() -> int:
    cases = load_all()
    rc = check_patterns(cases)
    bad = 0
    for name, c in cases.items():
        if c.healthy:
            continue
        para = PARAPHRASES.get(name, [])
        if len(para) != 2:
            print(f"{name}: needs two paraphrases, has {len(para)}")
            bad += 1
            continue
        pattern = re.compile(c.cause_pattern, re.IGNORECASE)
        for p in para:
            if not pattern.search(p):
                print(f"{name}: paraphrase NOT matched: {p}")
                bad += 1
    print(f"paraphrase misses: {bad}")
    return 1 if (rc or bad) else 0


if __name__ == "__main__":
    sys.exit(main())
