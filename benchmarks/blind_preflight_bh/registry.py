"""Set bh's case registry (density estimation and generative modelling): set a's Case / CaseTable, its own case
table, and the one-line fixes ``verify.py`` trains next to each broken case (``FIXES``: no preflight involved)."""

from __future__ import annotations

from benchmarks.blind_preflight.fixes import FixTable
from benchmarks.blind_preflight.registry import CaseTable, twin  # noqa: F401

TABLE = CaseTable.by_family("benchmarks.blind_preflight_bh")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def register(name, family, bug, pattern, metric, label):
    """Register a broken case and its one-line fix (the same builder with fixed=True) on the case's own metric
    (lower is better for every metric of this set)."""
    def wrap(builder):
        case(name, family, bug, pattern)(builder)
        fix(name, fixed_of(builder), metric, label, higher=False)
        return builder
    return wrap
