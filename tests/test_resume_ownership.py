"""checkpoint.resume=auto resumes only this run's checkpoints: one copied in from another
run (another run id, a step that disagrees with its name) is skipped and set aside; a
config change that alters training is a warning naming old -> new."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import REPO, run_cli

TINY = ("recipe=char_lm_tiny", "preflight.enabled=false", "logging.progress=none", "checkpoint.every_n_steps=10")


@pytest.mark.slow
def test_a_foreign_checkpoint_copied_in_is_skipped_and_the_runs_own_is_resumed(tmp_path):
    other, run = tmp_path / "other", tmp_path / "run"
    assert run_cli(other, *TINY, "trainer.max_steps=30", "trainer.seed=7", cwd=REPO).returncode == 0
    assert run_cli(run, *TINY, "trainer.max_steps=20", cwd=REPO).returncode == 0
    shutil.copytree(other / "checkpoints" / "step_00000030", run / "checkpoints" / "step_00000029")
    resumed = run_cli(run, *TINY, "trainer.max_steps=40", cwd=REPO)
    assert resumed.returncode == 0, resumed.output
    assert resumed.summary()["resumed_from"].endswith("step_00000020")
    assert "skipping checkpoint" in resumed.output and "another run" in resumed.output
    assert not (run / "checkpoints" / "step_00000029").exists()  # set aside, not deleted
    assert any(p.name.startswith("set-aside") for p in (run / "checkpoints").iterdir())


@pytest.mark.slow
def test_a_change_that_alters_training_is_a_warning_naming_old_and_new(tmp_path):
    run = tmp_path / "run"
    assert run_cli(run, *TINY, "trainer.max_steps=10", cwd=REPO).returncode == 0
    resumed = run_cli(run, *TINY, "trainer.max_steps=20", "trainer.accumulation_steps=2", cwd=REPO)
    assert resumed.returncode == 0, resumed.output
    warning = next(line for line in resumed.output.splitlines() if "change training" in line)
    assert "WARNING" in warning and "trainer.accumulation_steps 1 -> 2" in warning


@pytest.mark.slow
def test_allow_config_change_false_refuses_a_change_that_alters_training(tmp_path):
    run = tmp_path / "run"
    assert run_cli(run, *TINY, "trainer.max_steps=10", cwd=REPO).returncode == 0
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    refused = run_cli(run, *TINY, "trainer.max_steps=20", "data.batch_size=4", "checkpoint.allow_config_change=false", cwd=REPO)
    assert refused.returncode == 2, refused.output
    assert "checkpoint.allow_config_change" in refused.output and "data.batch_size 16 -> 4" in refused.output
    assert "Traceback" not in refused.output
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
