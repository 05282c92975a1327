"""Multirun sweeps: a summary table of every job, and skipping jobs already done.

The summary is written by a Hydra callback at the end of a multirun (and by the CLI
when a sweep stops early), from what each job left in its directory: summary.json,
preflight.json, metrics.jsonl and Hydra's .hydra/overrides.yaml; what was swept comes
from the sweep's own multirun.yaml. Overrides the toolkit generated itself (a recipe's
declared config, recipe_config.py) are not the user's and are not listed.

After the fixed columns' losses come the recipe's own metrics, one column per key of
summary.json's ``metrics`` in any job (the last evaluation's ``val_*``, then the test's
``test_*``), and after ``status`` a ``stop_reason`` column when some job stopped early.

Memory columns say what they measure, so that only like is put beside like:
``peak_rss_gib`` is the whole process (Python, libraries, data and tensors),
``measured_tensor_peak_gib`` the tensors alone where something counted them
(torch.cuda.max_memory_allocated on CUDA), ``predicted_tensor_peak_gib`` the preflight's
prediction of a training step's tensors on ``predicted_for`` (the job's GPU or
preflight.memory.target_gib, else host RAM). summary.csv also keeps the earlier
``peak_memory_gib`` and ``predicted_peak_gib`` for scripts that read them.

Why this module is long (~330 lines): the columns' meanings and the reading of each
job's files must agree, so they are defined together.
"""

from __future__ import annotations

import csv
import json
import logging
import statistics
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import TaskFunction
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from optimus_preflight.config.changes import EXPECTED_CHANGES, config_changes
from optimus_preflight.config.recipe_config import is_generated_override
from optimus_preflight.reporting.json_records import NONFINITE_KEY, to_float, value_of
from optimus_preflight.reporting.summary import reset_memory_peaks

log = logging.getLogger("optimus_preflight")

COLUMNS = (
    "job",
    "overrides",
    "status",
    "steps",
    "final_loss",
    "final_val_loss",
    "samples_per_s",
    "device",
    "peak_rss_gib",
    "measured_tensor_peak_gib",
    "predicted_tensor_peak_gib",
    "predicted_for",
)
# Earlier names, in summary.csv only: peak_memory_gib mixes RSS (CPU) with tensor
# memory (CUDA), so it is not shown beside a prediction in summary.md.
LEGACY_COLUMNS = ("peak_memory_gib", "predicted_peak_gib")
CSV_COLUMNS = COLUMNS + LEGACY_COLUMNS
GIB = 1024**3
# Where each memory check's prediction is for (preflight.json check name -> device).
PREDICTIONS = (("memory.vram_headroom", "cuda"), ("memory.host_ram", "cpu"))
# Under summary.md's table: the column names alone do not say what each memory figure counts.
MEMORY_LEGEND = (
    "peak_rss_gib: the whole process's peak resident memory (Python, libraries, data, tensors). "
    "measured_tensor_peak_gib: tensors only, torch.cuda.max_memory_allocated (not measured on the CPU). "
    "predicted_tensor_peak_gib: the preflight's prediction of a training step's tensors on "
    "predicted_for; compare it with measured_tensor_peak_gib, not with peak_rss_gib."
)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _median_throughput(metrics: Path) -> float | None:
    if not metrics.is_file():
        return None
    rates = []
    for line in metrics.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if isinstance(record.get("samples_per_s"), (int, float)):
            rates.append(record["samples_per_s"])
    # The first interval includes warm-up (allocations, kernel selection); leave it out.
    rates = rates[1:] or rates
    return statistics.median(rates) if rates else None


def predicted_tensor_peak(preflight: dict[str, Any] | None) -> tuple[int, str] | None:
    """The training step's predicted tensor bytes from preflight.json and the device they
    are for: the GPU (local or preflight.memory.target_gib) when that check applied, else
    host RAM."""
    checks = {check.get("name"): check for check in (preflight or {}).get("checks", [])}
    for name, device in PREDICTIONS:
        value = (checks.get(name) or {}).get("data", {}).get("need_bytes")
        if isinstance(value, (int, float)):
            return int(value), device
    return None


def _preflight_device(preflight: dict[str, Any] | None) -> str | None:
    for check in (preflight or {}).get("checks", []):
        if check.get("name") == "env.device":
            device = (check.get("data") or {}).get("device")
            return str(device) if device else None
    return None


def measured_memory(summary: dict[str, Any] | None, preflight: dict[str, Any] | None) -> dict[str, Any]:
    """The job's device, peak RSS and measured tensor peak (bytes; None where unknown)."""
    memory = (summary or {}).get("memory")
    if isinstance(memory, dict):
        return {
            "device": memory.get("device"),
            "peak_rss_bytes": memory.get("peak_rss_bytes"),
            "peak_tensor_bytes": memory.get("peak_tensor_bytes"),
        }
    # A summary.json from before "memory": peak_memory_bytes is tensor memory on CUDA
    # and RSS on the CPU, told apart by the device the preflight saw.
    device = _preflight_device(preflight)
    peak = (summary or {}).get("peak_memory_bytes")
    on_cuda = device is not None and device.startswith("cuda")
    on_cpu = device is not None and device.startswith("cpu")
    return {
        "device": device,
        "peak_rss_bytes": peak if on_cpu else None,
        "peak_tensor_bytes": peak if on_cuda else None,
    }


def _gib(value: Any) -> float | None:
    return value / GIB if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def job_overrides(job_dir: Path) -> list[str]:
    overrides_file = job_dir / ".hydra" / "overrides.yaml"
    if not overrides_file.is_file():
        return []
    return [str(o) for o in yaml.safe_load(overrides_file.read_text(encoding="utf-8")) or []]


def user_overrides(job_dir: Path) -> list[str]:
    """The job's overrides less those the toolkit generated (``recipe_defaults=...``, the
    ``model=``/``data=`` options a recipe class declares): what the user chose."""
    return [override for override in job_overrides(job_dir) if not is_generated_override(override)]


def _override_key(override: str) -> str:
    """``+model@pkg=x`` -> ``model@pkg``: what two overrides of one parameter share."""
    return override.split("=", 1)[0].strip().lstrip("+~")


def swept_keys(sweep_dir: Path) -> set[str] | None:
    """The parameters the sweep varies (comma lists, ranges, choices, globs), from the
    command line and hydra.sweeper.params that Hydra saved in multirun.yaml; None when
    that file is missing or unreadable."""
    try:
        saved = yaml.safe_load((sweep_dir / "multirun.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    hydra_cfg = saved.get("hydra") if isinstance(saved, dict) else None
    if not isinstance(hydra_cfg, dict):
        return None
    overrides = [str(o) for o in (hydra_cfg.get("overrides") or {}).get("task") or []]
    params = (hydra_cfg.get("sweeper") or {}).get("params") or {}
    overrides += [f"{key}={value}" for key, value in params.items()]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return None
    return {_override_key(o.input_line) for o in parsed if o.is_sweep_override()}


def shared_overrides(sweep_dir: Path, job_dirs: list[Path]) -> set[str]:
    """Overrides every job has and the sweep does not vary. From the jobs alone, a sweep
    stopped after its first job would call every swept value of that job shared."""
    per_job = [set(user_overrides(path)) for path in job_dirs]
    common = set.intersection(*per_job) if per_job else set()
    swept = swept_keys(sweep_dir)
    if swept is None:
        return common
    return {override for override in common if _override_key(override) not in swept}


def summary_metrics(summary: dict[str, Any] | None) -> dict[str, float | None]:
    """summary.json's ``metrics`` (the last evaluation's and the test's), as numbers; a
    non-finite one comes back from ``nonfinite``. ``val_loss`` is left out: it is the
    ``final_val_loss`` column already."""
    metrics = (summary or {}).get("metrics")
    if not isinstance(metrics, dict):
        return {}
    nonfinite = (summary or {}).get(NONFINITE_KEY) or {}
    values = {}
    for key, value in metrics.items():
        key = str(key)
        if key == "val_loss" or key in CSV_COLUMNS or key == "stop_reason":
            continue
        number = to_float(value)
        values[key] = number if number is not None else to_float(nonfinite.get(f"metrics.{key}"))
    return values


def job_row(job_dir: Path, job: str, common: set[str] = frozenset()) -> dict[str, Any]:
    overrides = [o for o in user_overrides(job_dir) if o not in common]
    summary = _read_json(job_dir / "summary.json")
    preflight = _read_json(job_dir / "preflight.json")
    if summary is not None:
        status = summary.get("status")
    elif preflight is not None:
        status = f"preflight {preflight.get('status')}"
    else:
        status = "failed (no output)"
    measured = measured_memory(summary, preflight)
    predicted, predicted_for = predicted_tensor_peak(preflight) or (None, None)
    return {
        "job": job,
        "overrides": " ".join(overrides),
        "status": status,
        "steps": (summary or {}).get("steps"),
        "final_loss": value_of(summary or {}, "final_loss"),
        "final_val_loss": value_of(summary or {}, "final_val_loss"),
        "samples_per_s": _median_throughput(job_dir / "metrics.jsonl"),
        "device": measured["device"],
        "peak_rss_gib": _gib(measured["peak_rss_bytes"]),
        "measured_tensor_peak_gib": _gib(measured["peak_tensor_bytes"]),
        "predicted_tensor_peak_gib": _gib(predicted),
        "predicted_for": predicted_for,
        "peak_memory_gib": _gib((summary or {}).get("peak_memory_bytes")),
        "predicted_peak_gib": _gib(predicted),
        "stop_reason": (summary or {}).get("stop_reason") or None,
        **summary_metrics(summary),
    }


def _metric_order(key: str) -> tuple[int, str]:
    return (0 if key.startswith("val_") else 1 if key.startswith("test_") else 2, key)


def table_columns(rows: list[dict[str, Any]], base: tuple[str, ...] = COLUMNS) -> list[str]:
    """``base`` with the metric columns after final_val_loss (the union over the jobs:
    val_*, then test_*) and stop_reason after status when some job has one."""
    metrics = sorted({key for row in rows for key in row} - set(CSV_COLUMNS) - {"stop_reason"}, key=_metric_order)
    columns = []
    for column in base:
        columns.append(column)
        if column == "status" and any(row.get("stop_reason") for row in rows):
            columns.append("stop_reason")
        if column == "final_val_loss":
            columns += metrics
    return columns


def _job_dirs(sweep_dir: Path) -> list[Path]:
    dirs = [p for p in sweep_dir.iterdir() if p.is_dir() and (p / ".hydra").is_dir()]
    return sorted(dirs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))


def _format(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _cell(value: Any) -> str:
    """A markdown table cell: a "|" or a line break in a text (a stop reason) would end it."""
    return " ".join(_format(value).split()).replace("|", "\\|")


def write_sweep_summary(sweep_dir: Path) -> list[dict[str, Any]]:
    """Write summary.csv and summary.md at the sweep root; log the table."""
    if not sweep_dir.is_dir():
        return []
    job_dirs = _job_dirs(sweep_dir)
    # Show what differs between jobs; what they share goes above the table.
    common = shared_overrides(sweep_dir, job_dirs)
    rows = [job_row(path, path.name, common) for path in job_dirs]
    with open(sweep_dir / "summary.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=table_columns(rows, CSV_COLUMNS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    columns = table_columns(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    shared = " ".join(sorted(common)) or "(none)"
    table = f"Overrides shared by every job: {shared}\n\n" + "\n".join(lines) + "\n\n" + MEMORY_LEGEND + "\n"
    (sweep_dir / "summary.md").write_text(table, encoding="utf-8")
    log.info("sweep summary (%s):\n%s", sweep_dir / "summary.md", table)
    return rows


class SweepSummaryCallback(Callback):
    """Registered in conf/config.yaml under hydra.callbacks."""

    def on_job_start(self, config: DictConfig, *, task_function: TaskFunction, **kwargs: Any) -> None:
        # A sweep's jobs run one after another in one process: without this, each job's
        # peaks would be the largest of every job before it.
        reset_memory_peaks()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        write_sweep_summary(Path(config.hydra.sweep.dir))


def already_completed(run_dir: Path, cfg: DictConfig) -> bool:
    """Re-running a sweep with checkpoint.resume=auto skips the jobs that finished with
    this same config; a changed value runs (and is validated) rather than being skipped."""
    if cfg.checkpoint.resume != "auto" or cfg.preflight.only:
        return False
    summary = _read_json(run_dir / "summary.json")
    if not (summary and summary.get("status") == "completed"):
        return False
    # An early-stopped job is done; an epoch-limited one (max_steps null) ran its epochs.
    max_steps = cfg.trainer.max_steps
    if not summary.get("stop_reason") and max_steps is not None and (summary.get("steps") or 0) < max_steps:
        return False
    try:
        saved = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=True)
    except (OSError, ValueError, yaml.YAMLError):
        return False
    current = OmegaConf.to_container(cfg, resolve=True)
    if max_steps is None and isinstance(saved.get("trainer"), dict):  # the run wrote the length it resolved
        current["trainer"]["max_steps"] = saved["trainer"].get("max_steps")
    return not [key for key in config_changes(saved, current) if not key.startswith(EXPECTED_CHANGES)]
