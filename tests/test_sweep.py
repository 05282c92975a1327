"""Multirun sweeps: a summary of every job, failures that do not stop the sweep, resume."""

from __future__ import annotations

import csv

import pytest

from tests.conftest import REPO, run_cli

TINY = ("recipe=char_lm_tiny", "logging.progress=none", "trainer.max_steps=4", "trainer.eval_every_n_steps=0")


def _rows(sweep_dir):
    with open(sweep_dir / "summary.csv", newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_two_by_two_sweep_summarises_every_job_and_survives_a_failed_one(tmp_path):
    sweep_dir = tmp_path / "sweep"
    # batch 100000 with drop_last leaves no batch at all: that job fails, the others run.
    result = run_cli(
        tmp_path / "unused",
        "-m",
        *TINY,
        "data.drop_last=true",
        "optimizer.lr=1e-3,3e-3",
        "data.batch_size=8,100000",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert result.returncode == 2, result.output  # the worst job's exit code
    rows = _rows(sweep_dir)
    assert [row["job"] for row in rows] == ["0", "1", "2", "3"]
    by_overrides = {row["overrides"]: row for row in rows}
    assert by_overrides["optimizer.lr=0.001 data.batch_size=8"]["status"] == "completed"
    assert by_overrides["optimizer.lr=0.003 data.batch_size=8"]["status"] == "completed"
    assert by_overrides["optimizer.lr=0.001 data.batch_size=100000"]["status"] == "failed"
    assert by_overrides["optimizer.lr=0.003 data.batch_size=100000"]["status"] == "failed"
    for row in rows:
        if row["status"] == "completed":
            assert row["steps"] == "4" and float(row["final_loss"]) > 0 and float(row["samples_per_s"]) > 0
            assert float(row["peak_memory_gib"]) > 0
    markdown = (sweep_dir / "summary.md").read_text()
    assert "data.drop_last=True" in markdown.splitlines()[0]  # shared overrides above the table
    assert "| 3 |" in markdown and "produced no batches" in result.output


@pytest.mark.slow
def test_fail_fast_stops_at_the_first_failed_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        tmp_path / "unused", "-m", *TINY, "data.drop_last=true", "sweep.fail_fast=true",
        "data.batch_size=100000,8", f"hydra.sweep.dir={sweep_dir}",
    )
    assert result.returncode == 2
    assert [row["status"] for row in _rows(sweep_dir)] == ["failed"]
    assert not (sweep_dir / "1").exists()


@pytest.mark.slow
def test_rerunning_an_interrupted_sweep_resumes_it_and_skips_finished_jobs(tmp_path):
    sweep_dir = tmp_path / "sweep"
    command = (
        "-m", "recipe=char_lm_tiny", "logging.progress=none", "recipe._target_=tests.signal_recipe.SelfSignalRecipe",
        "trainer.max_steps=12", "checkpoint.every_n_steps=4", "trainer.seed=0,1", f"hydra.sweep.dir={sweep_dir}",
    )
    interrupted = run_cli(tmp_path / "unused", *command, cwd=REPO, env={"SIGNAL_NAME": "SIGTERM", "SIGNAL_PHASE": "train", "SIGNAL_AT": "6"})
    assert interrupted.returncode == 143
    assert [row["status"] for row in _rows(sweep_dir)] == ["interrupted"]

    resumed = run_cli(tmp_path / "unused", *command, cwd=REPO)
    assert resumed.returncode == 0, resumed.output
    assert "resumed from" in resumed.output and resumed.output.count("resumed from") == 1
    rows = _rows(sweep_dir)
    assert [row["status"] for row in rows] == ["completed", "completed"] and {row["steps"] for row in rows} == {"12"}

    again = run_cli(tmp_path / "unused", *command, cwd=REPO)
    assert again.returncode == 0
    assert again.output.count("already completed 12 steps: skipping") == 2
