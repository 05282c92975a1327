"""Check set bb's cause patterns (no preflight): each broken case's cause_pattern must match its own bug sentence and
the hand-written paraphrases of a correct diagnosis in paraphrases.py, and none of the generic warnings set a's
checker lists (what a checker says about a run without naming this set's causes).

    .venv/bin/python -m benchmarks.blind_preflight_bb.check_patterns
"""

from __future__ import annotations

import re
import sys

from benchmarks.blind_preflight.patterns import check_patterns
from benchmarks.blind_preflight_bb.paraphrases import PARAPHRASES
from benchmarks.blind_preflight_bb.registry import load_all


def check_paraphrases(cases) -> int:
    """Number of broken cases whose pattern misses one of its paraphrases (or that has none)."""
    failed = 0
    broken = [name for name, c in cases.items() if not c.healthy]
    for name in broken:
        texts = PARAPHRASES.get(name, [])
        missed = [t for t in texts if not re.search(cases[name].cause_pattern, t, re.IGNORECASE)]
        if missed or not texts:
            failed += 1
            print(f"{name}: paraphrases not matched: {missed or 'none written'}")
    print(f"{len(broken) - failed}/{len(broken)} patterns match every hand-written paraphrase of a correct diagnosis")
    return failed


if __name__ == "__main__":
    cases = load_all()
    rc = check_patterns(cases)
    bad = check_paraphrases(cases)
    sys.exit(rc or (1 if bad else 0))
