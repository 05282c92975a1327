"""Stops, resume choices and checkpoint problems, through the real CLI."""

from __future__ import annotations

import json

import pytest

from optimus_preflight.checkpoint.resume import check_resume_value
from optimus_preflight.checkpoint.store import MANIFEST_FILE, STATE_FILE
from optimus_preflight.errors import UserError
from optimus_preflight.recipes.char_lm import CharLMRecipe
from tests.conftest import REPO, run_cli, tiny_config

SIGNALLING = ("recipe=char_lm_tiny", "logging.progress=none", "recipe._target_=tests.signal_recipe.SelfSignalRecipe", "trainer.max_steps=12", "checkpoint.every_n_steps=4")


def _checkpoints(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))


@pytest.mark.slow
@pytest.mark.parametrize("where", ["between_bytecodes", "inside_a_cpp_call"])
def test_second_ctrl_c_exits_at_once_and_keeps_the_last_checkpoint(tmp_path, where):
    """The second Ctrl+C ends the run at once, also while the main thread sits in one long
    C++ call (a backward, a big matmul), where Python-level handlers cannot run."""
    run_dir = tmp_path / "run"
    marker = tmp_path / "second_sigint_sent_at"
    env = {"SIGNAL_NAME": "SIGINT", "SIGNAL_PHASE": "train", "SIGNAL_AT": "6"}
    if where == "between_bytecodes":
        env["SIGNAL_REPEAT"] = "2"
    else:
        env.update(SIGNAL_SECOND_IN_OP=str(marker), SIGNAL_OP_S="120")
    result = run_cli(run_dir, *SIGNALLING, cwd=REPO, env=env)
    assert result.returncode == 130, result.output
    if where == "inside_a_cpp_call":
        # The process ended while the main thread was still inside the call.
        assert marker.exists() and not marker.with_suffix(".finished").exists(), result.output
    assert "Traceback" not in result.output
    message = [line for line in result.stderr.splitlines() if "interrupted twice" in line]
    assert len(message) == 1, result.stderr
    assert str(run_dir / "checkpoints" / "step_00000004") in message[0]
    assert f"hydra.run.dir={run_dir.resolve()}" in message[0] and "checkpoint.resume=auto" in message[0]
    summary = result.summary()
    assert summary["status"] == "interrupted" and summary["params_sha256"] is None
    assert _checkpoints(run_dir) == ["step_00000004"]  # no new checkpoint, the old one intact
    resumed = run_cli(run_dir, *SIGNALLING, cwd=REPO)
    assert resumed.returncode == 0 and resumed.summary()["resumed_from"].endswith("step_00000004")


@pytest.mark.slow
def test_ctrl_c_in_a_sweep_checkpoints_the_job_and_stops_the_sweep(tmp_path):
    sweep_dir = tmp_path / "sweep"
    env = {"SIGNAL_NAME": "SIGINT", "SIGNAL_PHASE": "train", "SIGNAL_AT": "6"}
    result = run_cli(tmp_path / "unused", "-m", *SIGNALLING, "trainer.seed=0,1", f"hydra.sweep.dir={sweep_dir}", cwd=REPO, env=env)
    assert result.returncode == 130, result.output
    assert _checkpoints(sweep_dir / "0") == ["step_00000004", "step_00000006"]
    assert json.loads((sweep_dir / "0" / "summary.json").read_text())["status"] == "interrupted"
    assert not (sweep_dir / "1").exists()


@pytest.mark.slow
def test_truncated_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli(run_dir, *SIGNALLING, "trainer.max_steps=8", cwd=REPO)
    assert first.returncode == 0, first.output
    state = run_dir / "checkpoints" / "step_00000008" / STATE_FILE
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    resumed = run_cli(run_dir, *SIGNALLING, cwd=REPO)
    assert resumed.returncode == 0, resumed.output
    assert "skipping checkpoint" in resumed.output and "truncated" in resumed.output
    assert resumed.summary()["resumed_from"].endswith("step_00000004")


@pytest.mark.slow
def test_missing_explicit_checkpoint_is_a_user_error(tmp_path):
    result = run_cli(tmp_path / "run", *SIGNALLING, f"checkpoint.resume={tmp_path / 'nope'}", cwd=REPO)
    assert result.returncode == 2 and "Traceback" not in result.output
    assert "checkpoint.resume" in result.stderr and "does not exist" in result.stderr
    assert not (tmp_path / "run").exists()


def test_resume_paths_that_hold_no_checkpoint_are_rejected_before_any_work(tmp_path):
    """What was given and what is expected, from the shape of the path alone."""
    never_saved = tmp_path / "never_saved"
    (never_saved / ".hydra").mkdir(parents=True)
    (never_saved / "summary.json").write_text('{"status": "failed"}')
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("x")
    cases = {
        never_saved: "is a run directory that holds no checkpoint",
        plain: "neither a checkpoint nor a run directory",
        plain / "notes.txt": "is a file, not a checkpoint",
    }
    for path, what in cases.items():
        with pytest.raises(UserError) as caught:
            check_resume_value(str(path))
        text = str(caught.value)
        assert what in text and f"checkpoint.resume={str(path)!r}" in text
        assert "expected a checkpoint directory (checkpoints/step_XXXXXXXX" in text
        assert "never finished" not in text
    unfinished = tmp_path / "run" / "checkpoints" / "step_00000004"
    unfinished.mkdir(parents=True)
    (unfinished / STATE_FILE).write_bytes(b"")
    check_resume_value(str(unfinished))  # a checkpoint's shape: its contents are checked at load


@pytest.mark.slow
def test_resuming_from_a_run_dir_without_checkpoints_exits_2_and_writes_nothing(tmp_path):
    never_saved = tmp_path / "never_saved"
    (never_saved / ".hydra").mkdir(parents=True)
    result = run_cli(tmp_path / "run", *SIGNALLING, f"checkpoint.resume={never_saved}", cwd=REPO)
    assert result.returncode == 2 and "Traceback" not in result.output
    assert "holds no checkpoint" in result.stderr
    assert "run dir" not in result.stdout  # rejected before the model was built
    assert not (tmp_path / "run").exists()  # no new `failed` summary behind it
    assert sorted(p.name for p in never_saved.iterdir()) == [".hydra"]


@pytest.mark.slow
def test_corrupt_explicit_checkpoint_and_changed_model_are_user_errors(tmp_path):
    source = tmp_path / "source"
    assert run_cli(source, *SIGNALLING, "trainer.max_steps=4", cwd=REPO).returncode == 0
    checkpoint = source / "checkpoints" / "step_00000004"

    # The exit code and the no-traceback rule of such errors are shown through the CLI in
    # tests/test_run_dir.py; here the public API raises the same UserError, faster.
    with pytest.raises(UserError, match="does not fit the model"):
        CharLMRecipe(tiny_config("model.d_model=48", f"checkpoint.resume={checkpoint}"), run_dir=tmp_path / "wider").run()

    changed = run_cli(tmp_path / "changed", *SIGNALLING, "optimizer.lr=1e-3", "trainer.max_steps=6", f"checkpoint.resume={checkpoint}", cwd=REPO)
    assert changed.returncode == 0, changed.output
    assert "optimizer.lr 0.003 -> 0.001" in changed.output and "trainer.max_steps 4 -> 6" in changed.output
    # Step 5 is the last warmup step (factor 1.0): the new LR applies from the resume on.
    step5 = next(r for r in changed.metrics() if r["step"] == 5 and "lr" in r)
    assert step5["lr"] == pytest.approx(1e-3)

    manifest = checkpoint / MANIFEST_FILE
    manifest.write_text(manifest.read_text().replace('"sha256": "', '"sha256": "0'))
    with pytest.raises(UserError, match="not a usable checkpoint"):
        CharLMRecipe(tiny_config(f"checkpoint.resume={checkpoint}"), run_dir=tmp_path / "corrupt").run()


@pytest.mark.slow
def test_ctrl_c_to_the_process_group_prints_no_worker_tracebacks(tmp_path):
    """A terminal's Ctrl+C reaches the DataLoader workers too. torch 2.13's worker loop
    already swallows KeyboardInterrupt; the workers also ignore SIGINT (worker_init_fn), so
    they keep serving while the main process reaches the step boundary. Either way the
    user sees one clean stop: exit 130, a checkpoint, no traceback."""
    import os
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    env = {**os.environ, "SIGNAL_NAME": "SIGINT", "SIGNAL_PHASE": "train", "SIGNAL_AT": "6", "SIGNAL_GROUP": "1"}
    command = [sys.executable, "-m", "optimus_preflight.cli", f"hydra.run.dir={run_dir}", *SIGNALLING, "data.num_workers=2"]
    # Its own session, so the group signal does not reach pytest.
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "KeyboardInterrupt" not in result.stderr
    assert (run_dir / "checkpoints" / "step_00000006").is_dir()


@pytest.mark.slow
def test_a_signal_during_preflight_stops_at_once_with_a_checkpoint(tmp_path):
    """The first-batch wait of the preflight is where a broken loader hangs; a signal there
    must not wait for preflight.first_batch_timeout_s."""
    run_dir = tmp_path / "run"
    env = {"SIGNAL_NAME": "SIGTERM", "SIGNAL_PHASE": "preflight", "SIGNAL_AT": "3"}
    result = run_cli(run_dir, *SIGNALLING, cwd=REPO, env=env)
    assert result.returncode == 143, result.output
    assert "Traceback" not in result.output
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert _checkpoints(run_dir) == ["step_00000000"]
    resumed = run_cli(run_dir, *SIGNALLING, cwd=REPO)
    assert resumed.returncode == 0 and resumed.summary()["steps"] == 12
