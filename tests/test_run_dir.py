"""Nothing lost, nothing overwritten: retention, the run-dir lock, bad input against an
existing run, damaged checkpoints. Through the CLI where Hydra's own files are at
stake, through the public API (faster) where they are not."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from optimus_preflight.checkpoint.store import MANIFEST_FILE, POINTER_FILE, STATE_FILE, verify
from optimus_preflight.errors import UserError
from optimus_preflight.recipes.char_lm import CharLMRecipe
from tests.conftest import CLI, REPO, run_cli, tiny_config

TINY = ("recipe=char_lm_tiny", "logging.progress=none", "trainer.max_steps=12", "checkpoint.every_n_steps=3")


def snapshot(directory: Path) -> dict[str, str]:
    """Every path under ``directory`` with the hash of its bytes (directories: 'dir')."""
    found = {}
    for path in sorted(directory.rglob("*")):
        key = str(path.relative_to(directory))
        found[key] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def steps(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))


@pytest.fixture(scope="module")
def completed_run(tmp_path_factory):
    """A finished 12-step run: checkpoints 6, 9, 12 kept (keep_last=3)."""
    run_dir = tmp_path_factory.mktemp("completed") / "run"
    result = run_cli(run_dir, *TINY, cwd=REPO)
    assert result.returncode == 0, result.output
    assert steps(run_dir) == ["step_00000006", "step_00000009", "step_00000012"]
    return run_dir


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy


# ------------------------------------------------------------------ C1 retention
@pytest.mark.slow
def test_a_fresh_start_in_a_dir_with_checkpoints_is_refused_and_touches_nothing(completed_run, tmp_path):
    run_dir = _copy(completed_run, tmp_path)
    before = snapshot(run_dir)
    result = run_cli(run_dir, *TINY, "trainer.max_steps=6", "trainer.seed=1", "checkpoint.resume=none", cwd=REPO)
    assert result.returncode == 2, result.output
    assert "Traceback" not in result.output
    assert "checkpoint.resume=auto" in result.output and "hydra.run.dir" in result.output
    assert snapshot(run_dir) == before


def test_damaged_and_foreign_checkpoints_never_take_keep_last_slots(completed_run, tmp_path):
    run_dir = _copy(completed_run, tmp_path)
    checkpoints = run_dir / "checkpoints"
    # Another run's checkpoint, copied in by hand, and a damaged one of this run.
    foreign = checkpoints / "step_00000004"
    shutil.copytree(checkpoints / "step_00000006", foreign)
    manifest = json.loads((foreign / MANIFEST_FILE).read_text())
    (foreign / MANIFEST_FILE).write_text(json.dumps({**manifest, "run_id": "someone-else"}))
    damaged = checkpoints / "step_00000005"
    shutil.copytree(checkpoints / "step_00000009", damaged)
    (damaged / STATE_FILE).write_bytes(b"\0" * 64)

    CharLMRecipe(tiny_config("trainer.max_steps=18", "checkpoint.every_n_steps=3"), run_dir=run_dir).run()

    # The newest three of this run are kept; the damaged and the foreign one are left alone.
    assert steps(run_dir) == ["step_00000004", "step_00000005", "step_00000012", "step_00000015", "step_00000018"]
    assert (checkpoints / POINTER_FILE).read_text().strip() == "step_00000018"
    for name in ("step_00000012", "step_00000015", "step_00000018"):
        verify(checkpoints / name)


def test_an_explicit_resume_from_an_older_checkpoint_sets_the_newer_ones_aside(completed_run, tmp_path):
    run_dir = _copy(completed_run, tmp_path)
    older = run_dir / "checkpoints" / "step_00000006"
    CharLMRecipe(tiny_config("trainer.max_steps=9", "checkpoint.every_n_steps=3", f"checkpoint.resume={older}"), run_dir=run_dir).run()
    assert steps(run_dir) == ["step_00000006", "step_00000009"]
    aside = list((run_dir / "checkpoints").glob("set-aside-superseded-*"))
    assert [sorted(p.name for p in a.iterdir()) for a in aside] == [["step_00000009", "step_00000012"]]


# ----------------------------------------------------------------------- C2 lock
@pytest.mark.slow
def test_a_second_process_on_a_locked_run_dir_exits_2_and_a_dead_holder_blocks_no_one(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([*CLI, f"hydra.run.dir={run_dir}", "recipe=char_lm_tiny", "logging.progress=none",
                               "trainer.max_steps=1000000", "checkpoint.every_n_steps=5"],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _wait_for(lambda: (run_dir / "checkpoints" / POINTER_FILE).exists(), holder)  # training is under way
        overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
        second = run_cli(run_dir, "recipe=char_lm_tiny", "logging.progress=none", "trainer.seed=7", cwd=REPO)
        assert second.returncode == 2, second.output
        assert f"in use by process {holder.pid}" in second.output and "Traceback" not in second.output
        # The second process wrote nothing: not Hydra's files, not the log, not a summary.
        assert (run_dir / ".hydra" / "overrides.yaml").read_text() == overrides
        assert "in use by" not in (run_dir / "train.log").read_text()
        assert not (run_dir / "summary.json").exists()
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean-up runs: the lock file stays behind
        holder.wait(timeout=60)
    assert (run_dir / ".optimus.lock").exists()
    resumed = CharLMRecipe(tiny_config("trainer.max_steps=5"), run_dir=run_dir).run()
    assert resumed["status"] == "completed" and resumed["resumed_from"]
    assert not (run_dir / ".optimus.lock").exists()  # released at the end of a run


def _wait_for(condition, process, timeout_s: float = 120.0) -> None:
    """Poll for an event; fail at once if the process died first."""
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, "the process ended before the event"
        assert time.monotonic() < deadline, "the event did not happen"
        time.sleep(0.05)


def test_two_recipes_in_one_process_cannot_run_in_one_dir(tmp_path):
    first = CharLMRecipe(tiny_config("trainer.max_steps=2"), run_dir=tmp_path / "run")
    first._running = True  # as run() does: the lock is taken in setup
    first.setup()
    try:
        with pytest.raises(UserError, match=f"in use by process {os.getpid()}"):
            CharLMRecipe(tiny_config("trainer.max_steps=2"), run_dir=tmp_path / "run").run()
    finally:
        first.close()
    assert CharLMRecipe(tiny_config("trainer.max_steps=2"), run_dir=tmp_path / "run").run()["status"] == "completed"


# -------------------------------------------------------- C3 bad input, existing run
# Through the CLI, where Hydra's .hydra/ and train.log are at stake: a builder's
# rejection and a checkpoint that does not fit. The other values: the API test below.
CLI_REJECTIONS = [
    ("data.train.block_size=0", "data.train.block_size"),  # read by the model through an interpolation
    ("optimizer=sgd", "optimizer"),  # the checkpoint holds AdamW's state
]


@pytest.mark.slow
@pytest.mark.parametrize("override, key", CLI_REJECTIONS, ids=[c[0] for c in CLI_REJECTIONS])
def test_bad_input_against_a_completed_run_exits_2_and_changes_nothing(completed_run, tmp_path, override, key):
    run_dir = _copy(completed_run, tmp_path)
    before = snapshot(run_dir)
    result = run_cli(run_dir, *TINY, override, cwd=REPO)
    assert result.returncode == 2, result.output
    assert "Traceback" not in result.output and key in result.output
    assert snapshot(run_dir) == before  # summary.json, .hydra/, train.log, checkpoints: all as they were


API_REJECTIONS = [
    ("model.n_head=0", "model.n_head"),
    ("model.n_head=3", "model.n_head"),
    ("optimizer.betas=[2,3]", "optimizer.betas"),
    ("model.dropout=2.0", "model.dropout"),
    ("model.d_model=48", "does not fit the model"),
    ("optimizer.lr=inf", "optimizer.lr"),
    ("optimizer.lr=nan", "optimizer.lr"),
    ("optimizer.weight_decay=-1", "optimizer.weight_decay"),
]


@pytest.mark.parametrize("override, expected", API_REJECTIONS, ids=[c[0] for c in API_REJECTIONS])
def test_values_only_a_builder_can_reject_are_user_errors_that_change_nothing(completed_run, tmp_path, override, expected):
    run_dir = _copy(completed_run, tmp_path)
    before = snapshot(run_dir)
    with pytest.raises(UserError, match=expected.replace(".", r"\.")):
        CharLMRecipe(tiny_config("trainer.max_steps=12", "checkpoint.every_n_steps=3", override), run_dir=run_dir).run()
    assert snapshot(run_dir) == before


def test_a_bad_value_in_a_new_dir_still_leaves_a_failed_summary(tmp_path):
    with pytest.raises(UserError, match="model.n_head"):
        CharLMRecipe(tiny_config("model.n_head=3"), run_dir=tmp_path / "new").run()
    assert json.loads((tmp_path / "new" / "summary.json").read_text())["status"] == "failed"


# ------------------------------------------------------------ C4 damaged resumes
def _damage(path: Path, how: str) -> None:
    if how == "manifest-list":
        (path / MANIFEST_FILE).write_text("[]")
    elif how == "manifest-fields":
        (path / MANIFEST_FILE).write_text(json.dumps({"files": {STATE_FILE: {"bytes": 1}}}))
    elif how == "unpicklable":  # a valid manifest over a state that weights_only refuses
        torch.save({"model": torch.nn.Linear(2, 2)}, path / STATE_FILE)
        data = (path / STATE_FILE).read_bytes()
        manifest = json.loads((path / MANIFEST_FILE).read_text())
        manifest["files"][STATE_FILE] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (path / MANIFEST_FILE).write_text(json.dumps(manifest))


DAMAGES = ["manifest-list", "manifest-fields", "unpicklable"]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_malformed_newest_checkpoint_falls_back_to_the_previous_one(completed_run, tmp_path, how, caplog):
    run_dir = _copy(completed_run, tmp_path)
    _damage(run_dir / "checkpoints" / "step_00000012", how)
    summary = CharLMRecipe(tiny_config("trainer.max_steps=12", "checkpoint.every_n_steps=3"), run_dir=run_dir).run()
    assert summary["status"] == "completed" and summary["resumed_from"].endswith("step_00000009")
    assert "skipping checkpoint" in caplog.text and "weights_only=False" not in caplog.text
    assert list((run_dir / "checkpoints").glob("set-aside-damaged-*/step_00000012"))  # kept, out of the way


@pytest.mark.parametrize("how", DAMAGES)
def test_an_explicit_malformed_checkpoint_is_a_user_error(completed_run, tmp_path, how):
    source = _copy(completed_run, tmp_path)
    _damage(source / "checkpoints" / "step_00000012", how)
    with pytest.raises(UserError, match="not a usable checkpoint") as caught:
        CharLMRecipe(tiny_config(f"checkpoint.resume={source / 'checkpoints' / 'step_00000012'}"), run_dir=tmp_path / "new").run()
    assert "weights_only=False" not in str(caught.value)


def test_when_every_checkpoint_is_damaged_auto_refuses_to_start_over_them(completed_run, tmp_path):
    run_dir = _copy(completed_run, tmp_path)
    for path in (run_dir / "checkpoints").glob("step_*"):
        _damage(path, "manifest-list")
    before = snapshot(run_dir)
    with pytest.raises(UserError, match="none of the 3 checkpoint"):
        CharLMRecipe(tiny_config("trainer.max_steps=12"), run_dir=run_dir).run()
    assert snapshot(run_dir) == before

