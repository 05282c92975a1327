"""Set f's case registry: set a's Case / CaseTable and data helpers, with its own case table."""

from __future__ import annotations

from benchmarks.blind_preflight.registry import (  # noqa: F401
    Case,
    CaseTable,
    loader,
    seed,
    teacher_classes,
    teacher_regression,
    token_sequences,
)

TABLE = CaseTable([f"benchmarks.blind_preflight_f.{name}" for name in (
    "cases_shapes", "cases_targets", "cases_trained", "cases_mechanics", "cases_data", "cases_healthy")])
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all
