"""Set c's case registry: the same Case / decorators as set a, with its own case table.
The data helpers (seed, loader, teacher_*) are set a's, imported unchanged."""

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

TABLE = CaseTable([f"benchmarks.blind_preflight_c.{name}" for name in (
    "cases_shapes_targets", "cases_trained_data", "cases_healthy")])
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all
