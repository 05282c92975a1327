"""Set b's case registry: its own CASES, the same Case type and data helpers as set 1."""

from __future__ import annotations

from benchmarks.blind_preflight.registry import Case, loader, seed, teacher_classes, teacher_regression, token_sequences  # noqa: F401

CASES: dict[str, Case] = {}


def case(name: str, family: str, bug: str = "", cause_pattern: str | None = None):
    def register(fn):
        if name in CASES:
            raise ValueError(f"duplicate case {name}")
        CASES[name] = Case(name, family, bug, cause_pattern, fn, fn.__module__)
        return fn
    return register


def healthy(name: str, description: str):
    return case(name, "healthy", description, None)


def decay_groups(model, weight_decay: float = 0.01) -> list[dict]:
    """AdamW parameter groups as the Hugging Face Trainer builds them: no decay on biases and norm weights."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for n, p in params if p.ndim < 2], "weight_decay": 0.0}]


def all_case_modules() -> list[str]:
    return [
        "benchmarks.blind_preflight_b.cases_shapes",
        "benchmarks.blind_preflight_b.cases_targets",
        "benchmarks.blind_preflight_b.cases_trained",
        "benchmarks.blind_preflight_b.cases_data",
        "benchmarks.blind_preflight_b.cases_mechanics",
        "benchmarks.blind_preflight_b.cases_healthy",
    ]


def load_all() -> dict[str, Case]:
    import importlib
    for module in all_case_modules():
        importlib.import_module(module)
    return CASES

