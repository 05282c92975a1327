"""Reading runs and sweeps from disk for plotting (no matplotlib here).

A run dir holds ``metrics.jsonl`` (and usually ``summary.json``); a sweep dir holds
runs below it, as Hydra's multirun writes them (``<sweep>/<job>/metrics.jsonl`` with
the job's command-line overrides in ``<job>/.hydra/overrides.yaml``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from optimus_preflight.reporting.json_records import to_float, value_of

METRICS_FILE = "metrics.jsonl"

# The keys the toolkit itself writes to metrics.jsonl; every other numeric key is a
# recipe's own metric (``self.log``). Step records: reporting/step_log.py (step, epoch,
# loss, grad_norm, skipped_steps, grad_scale, samples_per_s, compile_warmup_s, time/*)
# and reporting/sinks.py (lr, lr/<group>, memory/*); dynamics/monitor.py (update_ratio/*,
# dead_fraction/*, grad_scale, skip_rate, warnings); reporting/json_records.py
# (nonfinite); evaluations in recipe.py (val_loss, and test_loss after training).
BUILTIN_KEYS = frozenset({
    "step", "epoch", "loss", "lr", "grad_norm", "skipped_steps", "grad_scale", "samples_per_s",
    "compile_warmup_s", "skip_rate", "warnings", "nonfinite", "val_loss", "test_loss",
})
BUILTIN_PREFIXES = ("lr/", "time/", "memory/", "update_ratio/", "dead_fraction/")
VAL_PREFIX, TEST_PREFIX = "val_", "test_"  # an evaluation's metrics, prefixed by recipe.py


@dataclass
class Run:
    path: Path
    records: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric; for a step logged twice (a resumed run re-logs
        the steps after its checkpoint) the later value wins."""
        by_step: dict[int, float] = {}
        for record in self.records:
            if key in record and "step" in record:
                value = value_of(record, key)
                if value is not None:
                    by_step[int(record["step"])] = value
        steps = sorted(by_step)
        return steps, [by_step[s] for s in steps]

    def keys(self, prefix: str) -> list[str]:
        return sorted({key for record in self.records for key in record if key.startswith(prefix)})

    def finite_keys(self) -> set[str]:
        """Keys with at least one finite number (a metric that was always NaN draws nothing)."""
        found: set[str] = set()
        for record in self.records:
            for key in record.keys() - found:
                value = value_of(record, key)
                if value is not None and math.isfinite(value):
                    found.add(key)
        return found

    def has(self, key: str) -> bool:
        return any(key in record for record in self.records)

    def warnings(self) -> list[dict[str, Any]]:
        return [warning for record in self.records for warning in record.get("warnings", [])]

    def final(self, key: str) -> float | None:
        """``final_<key>`` from summary.json, else the last logged value."""
        value = value_of(self.summary, f"final_{key}")
        if value is not None:
            return value
        _, values = self.series(key)
        return values[-1] if values else None


def is_builtin(key: str) -> bool:
    return key in BUILTIN_KEYS or key.startswith(BUILTIN_PREFIXES)


@dataclass(frozen=True)
class UserMetric:
    """A recipe's own metric, drawn on one panel: its training key ``name``, evaluation
    key ``val_<name>`` and test key ``test_<name>``, each None where nothing was logged.
    An evaluation metric without a training counterpart is titled ``val_<name>``."""

    title: str
    train: str | None
    val: str | None
    test: str | None


def user_metrics(runs: list[Run]) -> list[UserMetric]:
    """Every recipe metric with a finite value in some run, sorted by title; a test
    value alone (no training or evaluation curve to sit on) is left out."""
    keys = {key for run in runs for key in run.finite_keys() if not is_builtin(key)}
    train = {key for key in keys if not key.startswith((VAL_PREFIX, TEST_PREFIX))}
    metrics = [
        UserMetric(name, name, _present(VAL_PREFIX + name, keys), _present(TEST_PREFIX + name, keys)) for name in train
    ]
    for key in keys:
        name = key.removeprefix(VAL_PREFIX)
        if key.startswith(VAL_PREFIX) and name not in train:
            metrics.append(UserMetric(key, None, key, _present(TEST_PREFIX + name, keys)))
    return sorted(metrics, key=lambda metric: metric.title)


def _present(key: str, keys: set[str]) -> str | None:
    return key if key in keys else None


def read_records(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a killed process
    return records


def read_overrides(run_dir: Path) -> dict[str, str]:
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    items = yaml.safe_load(path.read_text()) or []
    pairs = (str(item).split("=", 1) for item in items if "=" in str(item))
    return {key.lstrip("+~"): value for key, value in pairs}


def load_run(run_dir: Path) -> Run:
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return Run(run_dir, read_records(run_dir / METRICS_FILE), summary, read_overrides(run_dir))


def _job_order(path: Path) -> tuple[int, str]:
    return (int(path.name), "") if path.name.isdigit() else (10**9, str(path))


def find_runs(path: Path) -> tuple[str, list[Run]]:
    """("run", [run]) for a run dir, ("sweep", runs) for a dir with runs below it."""
    if (path / METRICS_FILE).is_file():
        return "run", [load_run(path)]
    job_dirs = sorted({metrics.parent for metrics in path.rglob(METRICS_FILE)}, key=_job_order)
    return "sweep", [load_run(job) for job in job_dirs]


def swept_parameters(runs: list[Run]) -> list[str]:
    """Override keys whose values differ between the runs of a sweep."""
    keys = sorted({key for run in runs for key in run.overrides})
    return [key for key in keys if len({run.overrides.get(key) for run in runs}) > 1]


def label(run: Run, swept: list[str]) -> str:
    parts = [f"{key}={run.overrides[key]}" for key in swept if key in run.overrides]
    return ", ".join(parts) or run.path.name


def numeric(values: list[str | None]) -> list[float] | None:
    """The values as floats when all of them parse, else None (a categorical parameter)."""
    out = []
    for value in values:
        number = to_float(value)
        if number is None or not math.isfinite(number):
            return None
        out.append(number)
    return out
