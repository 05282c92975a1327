"""A closed terminal (SIGHUP) stops a run like SIGTERM: a checkpoint at the step
boundary, exit 129, the resume command in train.log. Under nohup it changes nothing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest

from tests.conftest import CLI, REPO, CliResult, run_cli

SIGNALLING = ("recipe=char_lm_tiny", "logging.progress=none",
              "recipe._target_=tests.signal_recipe.SelfSignalRecipe", "trainer.max_steps=12", "checkpoint.every_n_steps=4")
HANGUP = {"SIGNAL_NAME": "SIGHUP", "SIGNAL_PHASE": "train", "SIGNAL_AT": "6"}


def _default_sighup() -> None:
    # The caller (a CI runner, this sandbox) may itself ignore SIGHUP, which a child inherits.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.slow
def test_sighup_checkpoints_and_exits_129(tmp_path):
    run_dir = tmp_path / "run"
    completed = subprocess.run([*CLI, f"hydra.run.dir={run_dir}", *SIGNALLING], cwd=REPO, capture_output=True, text=True,
                               timeout=300, env={**os.environ, **HANGUP}, preexec_fn=_default_sighup)
    result = CliResult(completed.returncode, completed.stdout, completed.stderr, run_dir)
    assert result.returncode == 128 + signal.SIGHUP, result.output
    assert "Traceback" not in result.output
    log = (run_dir / "train.log").read_text()
    assert "stopped by SIGHUP" in log and "checkpoint.resume=auto" in log
    assert result.summary()["status"] == "interrupted"
    resumed = run_cli(run_dir, *SIGNALLING, cwd=REPO)
    assert resumed.returncode == 0 and resumed.summary()["steps"] == 12


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nohup") is None, reason="no nohup on this machine")
def test_under_nohup_sighup_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    completed = subprocess.run(["nohup", *CLI, f"hydra.run.dir={run_dir}", *SIGNALLING], cwd=REPO, capture_output=True,
                               text=True, timeout=300, env={**os.environ, **HANGUP})
    assert completed.returncode == 0, completed.stderr
    assert "SIGHUP" not in (run_dir / "train.log").read_text()
