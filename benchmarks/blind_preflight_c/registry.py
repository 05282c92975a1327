"""Set c's case registry: the same Case / decorators as set a, with its own case table.
The data helpers (seed, loader, teacher_*) are set a's, imported unchanged."""

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


def all_case_modules() -> list[str]:
    return [
        "benchmarks.blind_preflight_c.cases_shapes_targets",
        "benchmarks.blind_preflight_c.cases_trained_data",
        "benchmarks.blind_preflight_c.cases_healthy",
    ]


def load_all() -> dict[str, Case]:
    import importlib
    for module in all_case_modules():
        importlib.import_module(module)
    return CASES
