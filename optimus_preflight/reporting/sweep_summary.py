"""Multirun sweeps: a summary table of every job, and skipping jobs already done.

The summary is written by a Hydra callback at the end of a multirun (and by the CLI
when a sweep stops early), from what each job left in its directory: summary.json,
preflight.json, metrics.jsonl and Hydra's .hydra/overrides.yaml.
"""

from __future__ import annotations

import csv
import json
import logging
import statistics
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from optimus_preflight.config.changes import EXPECTED_CHANGES, config_changes
from optimus_preflight.reporting.json_records import value_of

log = logging.getLogger("optimus_preflight")

COLUMNS = (
    "job",
    "overrides",
    "status",
    "steps",
    "final_loss",
    "final_val_loss",
    "samples_per_s",
    "peak_memory_gib",
    "predicted_peak_gib",
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


def predicted_peak_bytes(preflight: dict[str, Any] | None) -> int | None:
    """The training step's predicted need from preflight.json: on the GPU (local or
    preflight.memory.target_gib) when that check applied, else in host RAM."""
    checks = {check.get("name"): check for check in (preflight or {}).get("checks", [])}
    for name in ("memory.vram_headroom", "memory.host_ram"):
        value = checks.get(name, {}).get("data", {}).get("need_bytes")
        if isinstance(value, (int, float)):
            return int(value)
    return None


def job_overrides(job_dir: Path) -> list[str]:
    overrides_file = job_dir / ".hydra" / "overrides.yaml"
    if not overrides_file.is_file():
        return []
    return [str(o) for o in yaml.safe_load(overrides_file.read_text(encoding="utf-8")) or []]


def job_row(job_dir: Path, job: str, common: set[str] = frozenset()) -> dict[str, Any]:
    overrides = [o for o in job_overrides(job_dir) if o not in common]
    summary = _read_json(job_dir / "summary.json")
    preflight = _read_json(job_dir / "preflight.json")
    if summary is not None:
        status = summary.get("status")
    elif preflight is not None:
        status = f"preflight {preflight.get('status')}"
    else:
        status = "failed (no output)"
    gib = 1024**3
    peak = (summary or {}).get("peak_memory_bytes")
    predicted = predicted_peak_bytes(preflight)
    return {
        "job": job,
        "overrides": " ".join(overrides),
        "status": status,
        "steps": (summary or {}).get("steps"),
        "final_loss": value_of(summary or {}, "final_loss"),
        "final_val_loss": value_of(summary or {}, "final_val_loss"),
        "samples_per_s": _median_throughput(job_dir / "metrics.jsonl"),
        "peak_memory_gib": peak / gib if peak else None,
        "predicted_peak_gib": predicted / gib if predicted else None,
    }


def _job_dirs(sweep_dir: Path) -> list[Path]:
    dirs = [p for p in sweep_dir.iterdir() if p.is_dir() and (p / ".hydra").is_dir()]
    return sorted(dirs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))


def _format(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_sweep_summary(sweep_dir: Path) -> list[dict[str, Any]]:
    """Write summary.csv and summary.md at the sweep root; log the table."""
    if not sweep_dir.is_dir():
        return []
    job_dirs = _job_dirs(sweep_dir)
    # Show what differs between jobs; what they share goes above the table.
    per_job = [set(job_overrides(path)) for path in job_dirs]
    common = set.intersection(*per_job) if per_job else set()
    rows = [job_row(path, path.name, common) for path in job_dirs]
    with open(sweep_dir / "summary.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_format(row[c]) for c in COLUMNS) + " |" for row in rows]
    shared = " ".join(sorted(common)) or "(none)"
    table = f"Overrides shared by every job: {shared}\n\n" + "\n".join(lines) + "\n"
    (sweep_dir / "summary.md").write_text(table, encoding="utf-8")
    log.info("sweep summary (%s):\n%s", sweep_dir / "summary.md", table)
    return rows


class SweepSummaryCallback(Callback):
    """Registered in conf/config.yaml under hydra.callbacks."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        write_sweep_summary(Path(config.hydra.sweep.dir))


def already_completed(run_dir: Path, cfg: DictConfig) -> bool:
    """Re-running a sweep with checkpoint.resume=auto skips the jobs that finished with
    this same config; a changed value runs (and is validated) rather than being skipped."""
    if cfg.checkpoint.resume != "auto" or cfg.preflight.only:
        return False
    summary = _read_json(run_dir / "summary.json")
    if not (summary and summary.get("status") == "completed" and (summary.get("steps") or 0) >= cfg.trainer.max_steps):
        return False
    try:
        saved = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=True)
    except (OSError, ValueError, yaml.YAMLError):
        return False
    current = OmegaConf.to_container(cfg, resolve=True)
    return not [key for key in config_changes(saved, current) if not key.startswith(EXPECTED_CHANGES)]
