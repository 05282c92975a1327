"""Set b's case registry: its own CASES, the same Case type and data helpers as set 1."""

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


def decay_groups(model, weight_decay: float = 0.01) -> list[dict]:
    """AdamW parameter groups as the Hugging Face Trainer builds them: no decay on biases and norm weights."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for n, p in params if p.ndim < 2], "weight_decay": 0.0}]


TABLE = CaseTable([f"benchmarks.blind_preflight_b.{name}" for name in (
    "cases_shapes", "cases_targets", "cases_trained", "cases_data", "cases_mechanics", "cases_healthy")])
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all
