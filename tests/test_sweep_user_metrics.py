"""The sweep table shows a recipe's own metrics (summary.json's "metrics"), a stop
reason where a job stopped early, and only the overrides the user chose (not those the
toolkit generated from a recipe class's declared config). Jobs are directories written
by hand, as tests/test_sweep_table.py builds them."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from optimus_preflight.config import recipe_config
from optimus_preflight.reporting.sweep_summary import COLUMNS, job_row, write_sweep_summary

EARLY_STOP = "early stopping: val_loss did not improve by more than 0 in 3 evaluation(s); best 1.9 at step 20"


def _write_job(sweep_dir: Path, job: str, overrides: list[str], summary: dict | None = None) -> Path:
    job_dir = sweep_dir / job
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if summary is not None:
        (job_dir / "summary.json").write_text(json.dumps({"status": "completed", "steps": 30, **summary}))
    return job_dir


def _write_multirun_yaml(sweep_dir: Path, task: list[str]) -> None:
    hydra_cfg = {"sweeper": {"params": None}, "overrides": {"hydra": ["hydra.mode=MULTIRUN"], "task": task}}
    (sweep_dir / "multirun.yaml").write_text(yaml.safe_dump({"hydra": hydra_cfg}))


def _table(sweep_dir: Path) -> tuple[str, list[str], list[dict[str, str]]]:
    """summary.md's shared-overrides line, its header and its rows by column name."""
    lines = (sweep_dir / "summary.md").read_text().splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if line.startswith("|")]
    header, body = rows[0], rows[2:]
    return lines[0], header, [dict(zip(header, row)) for row in body]


def _csv(sweep_dir: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(sweep_dir / "summary.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def _summary(val_loss: float, val_acc: float, test_acc: float | None = None, **extra) -> dict:
    metrics = {"val_loss": val_loss, "val_acc": val_acc, **({"test_loss": val_loss + 0.1, "test_acc": test_acc} if test_acc is not None else {})}
    return {"final_loss": val_loss - 0.1, "final_val_loss": val_loss, "metrics": metrics, "test": None, "epoch": 1,
            "stop_reason": None, "best_checkpoint": None, **extra}


def test_one_column_per_metric_of_any_job_val_then_test_and_a_stop_reason(tmp_path):
    _write_multirun_yaml(tmp_path, ["optimizer.lr=1e-3,1e-2,1e-1"])
    _write_job(tmp_path, "0", ["optimizer.lr=0.001"], _summary(2.0, 0.61, 0.6))
    bleu = _summary(1.9, 0.7, 0.68, stop_reason=EARLY_STOP)
    bleu["metrics"]["val_bleu"] = 0.25
    _write_job(tmp_path, "1", ["optimizer.lr=0.01"], bleu)
    _write_job(tmp_path, "2", ["optimizer.lr=0.1"], _summary(2.5, 0.4))  # no test split
    rows = write_sweep_summary(tmp_path)

    _, header, table = _table(tmp_path)
    metrics = ["val_acc", "val_bleu", "test_acc", "test_loss"]
    assert header[: header.index("samples_per_s")] == [
        "job", "overrides", "status", "stop_reason", "steps", "final_loss", "final_val_loss", *metrics
    ]
    assert "val_loss" not in header and header.count("final_val_loss") == 1  # not shown twice
    assert [[row[key] for key in metrics] for row in table] == [
        ["0.61", "-", "0.6", "2.1"], ["0.7", "0.25", "0.68", "2"], ["0.4", "-", "-", "-"]
    ]
    assert [row["stop_reason"] for row in table] == ["-", EARLY_STOP, "-"]
    assert rows[1]["val_bleu"] == 0.25 and rows[1]["stop_reason"] == EARLY_STOP

    fieldnames, csv_rows = _csv(tmp_path)
    assert set(metrics) | {"stop_reason", "peak_memory_gib"} <= set(fieldnames) and "val_loss" not in fieldnames
    assert float(csv_rows[1]["val_bleu"]) == 0.25 and csv_rows[2]["test_acc"] == ""


def test_no_metrics_and_no_early_stop_leave_the_columns_as_they_were(tmp_path):
    _write_job(tmp_path, "0", ["optimizer.lr=0.001"], {"final_loss": 2.0, "final_val_loss": 2.1})  # an older summary.json
    _write_job(tmp_path, "1", ["optimizer.lr=0.01"], {"final_loss": 2.0, "metrics": {"val_loss": 2.2}, "stop_reason": None})
    _write_job(tmp_path, "2", ["optimizer.lr=0.1"])  # failed before writing a summary
    write_sweep_summary(tmp_path)
    _, header, table = _table(tmp_path)
    assert header == list(COLUMNS)
    assert [row["final_val_loss"] for row in table] == ["2.1", "-", "-"]


def test_a_non_finite_metric_reads_back_as_nan_and_text_cannot_break_the_table(tmp_path):
    summary = _summary(2.0, 0.5, stop_reason="stopped | by\nhand")
    summary["metrics"]["val_acc"] = None
    summary["nonfinite"] = {"metrics.val_acc": "nan"}  # how summary.json writes a NaN
    job_dir = _write_job(tmp_path, "0", [], summary)
    assert job_row(job_dir, "0")["val_acc"] != job_row(job_dir, "0")["val_acc"]  # NaN
    write_sweep_summary(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    assert "| stopped \\| by hand |" in text
    _, header, _ = _table(tmp_path)
    assert "val_acc" in header


@dataclass
class _WidthConfig:
    width: int = 1


class DeclaringRecipe:
    model_config = _WidthConfig
    config_defaults = {"trainer": {"max_steps": 3}}


@pytest.fixture
def generated(monkeypatch) -> set[str]:
    """The overrides a recipe class that declares a model config and defaults generates,
    recorded as this process's; restored afterwards."""
    monkeypatch.setattr(recipe_config, "_generated_options", set())
    return set(recipe_config.recipe_overrides(DeclaringRecipe, ["recipe._target_=tests.my.DeclaringRecipe"]))


def test_overrides_the_toolkit_generated_are_left_out_of_shared_and_per_job_overrides(tmp_path, generated):
    name = recipe_config.option_name(DeclaringRecipe)
    assert generated == {f"model={name}", f"recipe_defaults={name}"}
    _write_multirun_yaml(tmp_path, ["recipe._target_=tests.my.A,tests.my.B", "trainer.max_steps=30"])
    for job, target in enumerate(["tests.my.A", "tests.my.B"]):
        # Each recipe class declares its own defaults: a recipe_defaults option per job.
        overrides = [f"recipe._target_={target}", "trainer.max_steps=30", *sorted(generated),
                     f"recipe_defaults={target.replace('.', '_')}"]
        _write_job(tmp_path, str(job), overrides, _summary(2.0, 0.5))
    rows = write_sweep_summary(tmp_path)

    shared, _, table = _table(tmp_path)
    assert shared == "Overrides shared by every job: trainer.max_steps=30"
    assert [row["overrides"] for row in table] == ["recipe._target_=tests.my.A", "recipe._target_=tests.my.B"]
    assert [row["overrides"] for row in rows] == ["recipe._target_=tests.my.A", "recipe._target_=tests.my.B"]


def test_a_user_chosen_option_of_a_group_is_kept(tmp_path, generated):
    """``model=char_transformer`` typed by the user is theirs; ``recipe._target_`` too."""
    common = ["recipe._target_=tests.my.A", "model=char_transformer", "data=default", "recipe_defaults=tests_my_A"]
    for job, lr in enumerate(["0.001", "0.01"]):
        _write_job(tmp_path, str(job), [*common, f"optimizer.lr={lr}"], _summary(2.0, 0.5))
    write_sweep_summary(tmp_path)
    shared, _, table = _table(tmp_path)
    assert shared == "Overrides shared by every job: data=default model=char_transformer recipe._target_=tests.my.A"
    assert [row["overrides"] for row in table] == ["optimizer.lr=0.001", "optimizer.lr=0.01"]
