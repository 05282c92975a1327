"""Set bk's case registry: set a's Case / CaseTable, its own case table, and the one-line fixes ``verify.py`` trains
next to each broken case (``FIXES``: no preflight involved)."""

from __future__ import annotations

from benchmarks.blind_preflight.fixes import FixTable
from benchmarks.blind_preflight.registry import CaseTable, twin  # noqa: F401

TABLE = CaseTable.by_family("benchmarks.blind_preflight_bk")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix
