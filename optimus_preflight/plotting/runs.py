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
    # Lines of metrics.jsonl that were not a record (not UTF-8, not JSON, not an object, a
    # step that is not a number): left out, and counted for the reader.
    skipped: int = 0
    # Each series is read once: the panels ask for the same keys many times, and a long
    # run has hundreds of thousands of records.
    _series: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict, repr=False)
    _keys: set[str] | None = field(default=None, repr=False)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric; for a step logged twice (a resumed run re-logs
        the steps after its checkpoint) the later value wins."""
        if key not in self._series:
            by_step: dict[int, float] = {}
            for record in self.records:
                if key in record and "step" in record:
                    value = _number(record, key)
                    if value is not None:
                        by_step[int(record["step"])] = value
            steps = sorted(by_step)
            self._series[key] = steps, [by_step[s] for s in steps]
        return self._series[key]

    def all_keys(self) -> set[str]:
        if self._keys is None:
            self._keys = set().union(*self.records) if self.records else set()
        return self._keys

    def keys(self, prefix: str) -> list[str]:
        return sorted(key for key in self.all_keys() if key.startswith(prefix))

    def finite_keys(self) -> set[str]:
        """Keys with at least one finite number (a metric that was always NaN draws nothing)."""
        return {key for key in self.all_keys() if any(math.isfinite(value) for value in self.series(key)[1])}

    def has(self, key: str) -> bool:
        return key in self.all_keys()

    def warnings(self) -> list[dict[str, Any]]:
        found = [warning for record in self.records for warning in _list(record.get("warnings"))]
        return [warning for warning in found if isinstance(warning, dict) and _is_step(warning.get("step"))
                and isinstance(warning.get("code"), str)]

    def final(self, key: str) -> float | None:
        """``final_<key>`` from summary.json, else the last logged value."""
        value = _number(self.summary, f"final_{key}")
        if value is not None:
            return value
        _, values = self.series(key)
        return values[-1] if values else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(record: dict[str, Any], key: str) -> float | None:
    try:
        return value_of(record, key)
    except (OverflowError, ValueError):  # an integer too large for a float
        return None


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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


def parse_record(line: bytes) -> dict[str, Any] | None:
    """One line of metrics.jsonl as a record, or None for anything a crash, a full disk or
    another writer can leave: bytes that are not UTF-8, a line cut short, JSON that is not
    an object, a number too long to parse, a step that is not a step number."""
    try:
        record = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None
    if not isinstance(record, dict) or ("step" in record and not _is_step(record["step"])):
        return None
    return record


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], int]:
    """(the records, how many non-empty lines were not one)."""
    records, skipped = [], 0
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        record = parse_record(line)
        if record is None:
            skipped += 1
        else:
            records.append(record)
    return records, skipped


def read_records(path: Path) -> list[dict[str, Any]]:
    return read_metrics(path)[0]


def read_overrides(run_dir: Path) -> dict[str, str]:
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    try:
        items = yaml.safe_load(path.read_bytes().decode("utf-8")) or []
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}  # damaged: the run is labelled by its directory instead
    if not isinstance(items, list):
        return {}
    pairs = (str(item).split("=", 1) for item in items if "=" in str(item))
    return {key.lstrip("+~"): value for key, value in pairs}


def _read_summary(path: Path) -> dict[str, Any]:
    """summary.json, or nothing when it is missing or damaged (a run killed mid-write)."""
    try:
        summary = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return summary if isinstance(summary, dict) else {}


def load_run(run_dir: Path) -> Run:
    records, skipped = read_metrics(run_dir / METRICS_FILE)
    return Run(run_dir, records, _read_summary(run_dir / "summary.json"), read_overrides(run_dir), skipped)


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
