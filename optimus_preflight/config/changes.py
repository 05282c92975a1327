"""How two configs of one run differ: a resume logs the changes, and a sweep job re-run
with checkpoint.resume=auto is skipped only when nothing but the expected keys changed."""

from __future__ import annotations

from typing import Any

# Keys a resume is expected to change; they are not logged, nor do they make a job new.
EXPECTED_CHANGES = ("checkpoint.resume", "preflight.", "logging.")

# Import paths configs saved by earlier releases hold, and where those objects live now.
RENAMED_TARGETS = {
    "optimus_preflight.optim.warmup_cosine": "optimus_preflight.training.optim.warmup_cosine",
    "optimus_preflight.optim.constant": "optimus_preflight.training.optim.constant",
    "optimus_preflight.sweep.SweepSummaryCallback": "optimus_preflight.reporting.sweep_summary.SweepSummaryCallback",
}


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        flat: dict[str, Any] = {}
        for key, value in tree.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: tree}


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    old, new = _flatten(saved), _flatten(current)
    old = {key: RENAMED_TARGETS.get(value, value) if isinstance(value, str) else value for key, value in old.items()}
    return {key: (old.get(key), new.get(key)) for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)}
