"""Check set bf's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence,
both hand-written paraphrases in paraphrases.py, and none of set a's generic warnings.

    .venv/bin/python -m benchmarks.blind_preflight_bf.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_bf.paraphrases import PARAPHRASES
from benchmarks.blind_preflight_bf.registry import load_all


def main() -> int:
    cases = load_all()
    rc = check_patterns(cases)
    bad = 0
    for name, c in cases.items():
        if c.healthy:
            continue
        para = PARAPHRASES.get(name, [])
        pattern = re.compile(c.cause_pattern, re.IGNORECASE)
        missed = [p for p in para if not pattern.search(p)]
        if len(para) != 2 or missed:
            bad += 1
            print(f"{name}: {len(para)} paraphrases; not matched: {missed}")
    n = sum(not c.healthy for c in cases.values())
    print(f"{n - bad}/{n} patterns match both paraphrases")
    return 1 if (rc or bad) else 0


if __name__ == "__main__":
    sys.exit(main())
