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
def test_two_by_two_sweep_summarises_every_job_and_survives_failed_ones(tmp_path):
    sweep_dir = tmp_path / "sweep"
    # batch 100000 with drop_last leaves no batch at all: with preflight on, that job fails
    # its preflight (DATA_EMPTY); with preflight off, it fails at its first step. The
    # other jobs run regardless.
    result = run_cli(
        tmp_path / "unused",
        "-m",
        *TINY,
        "data.drop_last=true",
        "preflight.enabled=true,false",
        "data.batch_size=8,100000",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert result.returncode == 3, result.output  # the worst job's exit code: preflight failed
    rows = _rows(sweep_dir)
    assert [row["job"] for row in rows] == ["0", "1", "2", "3"]
    statuses = {row["overrides"]: row["status"] for row in rows}
    assert statuses == {
        "preflight.enabled=True data.batch_size=8": "completed",
        "preflight.enabled=True data.batch_size=100000": "preflight_failed",
        "preflight.enabled=False data.batch_size=8": "completed",
        "preflight.enabled=False data.batch_size=100000": "failed",
    }
    for row in rows:
        if row["status"] == "completed":
            assert row["steps"] == "4" and float(row["final_loss"]) > 0 and float(row["samples_per_s"]) > 0
            assert float(row["peak_memory_gib"]) > 0
    assert float(rows[0]["predicted_peak_gib"]) > 0  # from the preflight's memory check
    markdown = (sweep_dir / "summary.md").read_text()
    assert "data.drop_last=True" in markdown.splitlines()[0]  # shared overrides above the table
    assert "| 3 |" in markdown and "DATA_EMPTY" in result.output and "produced no batches" in result.output


@pytest.mark.slow
def test_fail_fast_stops_at_the_first_failed_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        tmp_path / "unused", "-m", *TINY, "data.drop_last=true", "sweep.fail_fast=true",
        "data.batch_size=100000,8", f"hydra.sweep.dir={sweep_dir}",
    )
    assert result.returncode == 3
    assert [row["status"] for row in _rows(sweep_dir)] == ["preflight_failed"]
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


def test_a_bug_in_one_sweep_job_is_logged_with_its_traceback_and_contained(caplog, tiny_cfg, tmp_path, monkeypatch):
    from optimus_preflight.app import run_recipe

    monkeypatch.chdir(tmp_path)  # the recipe's default run dir is outputs/<date>/<time>
    from optimus_preflight.recipes.char_lm import CharLMRecipe

    class BrokenRecipe(CharLMRecipe):
        def build_model(self):
            raise RuntimeError("boom in user code")

    with pytest.raises(RuntimeError):  # a single run keeps the traceback: Hydra prints it, exit 1
        run_recipe(BrokenRecipe, tiny_cfg)
    caplog.clear()
    assert run_recipe(BrokenRecipe, tiny_cfg, contain_bugs=True) == 1
    record = next(r for r in caplog.records if "unexpected error" in r.getMessage())
    assert record.exc_info and "boom in user code" in str(record.exc_info[1])
