"""The resume command a stopped run prints runs as printed, for every way of starting a
run; and a resumed run's metrics.jsonl holds each step once."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from optimus_preflight.checkpoint.resume_command import MAKE_DIR_ENV, Launch, resume_command
from optimus_preflight.reporting.sinks import JsonlSink, drop_records_after
from tests.conftest import REPO, run_cli

CLI_FILE = str(REPO / "optimus_preflight" / "cli.py")


def _words(line: str, cwd: Path) -> list[str]:
    prefix = f"cd {shlex.quote(str(cwd))} && "
    assert line.startswith(prefix), line
    return shlex.split(line.removeprefix(prefix))


def _fake_bin(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_console_script_off_path_is_printed_with_its_path(tmp_path):
    script = _fake_bin(tmp_path, "optimus-train")
    launch = Launch(str(script), "/usr/bin/python3", {"PATH": "/usr/bin"}, str(tmp_path))
    words = _words(resume_command(tmp_path / "run", ["optimizer.lr=0.01"], launch), tmp_path)
    assert words == [str(script), "optimizer.lr=0.01", f"hydra.run.dir={(tmp_path / 'run').resolve()}", "checkpoint.resume=auto"]


def test_a_console_script_on_path_is_printed_by_name(tmp_path):
    script = _fake_bin(tmp_path, "optimus-train")
    launch = Launch(str(script), "/usr/bin/python3", {"PATH": f"/usr/bin:{script.parent}"}, str(tmp_path))
    assert _words(resume_command(tmp_path, [], launch), tmp_path)[0] == "optimus-train"


def test_the_old_run_dir_and_resume_values_are_replaced_and_spaces_quoted(tmp_path):
    script = _fake_bin(tmp_path, "optimus-train")
    overrides = ["hydra.run.dir=/elsewhere", "checkpoint.resume=none", "logging.progress=none", "+tag=a b"]
    words = _words(resume_command(tmp_path, overrides, Launch(str(script), sys.executable, {"PATH": ""}, str(tmp_path))), tmp_path)
    assert words[1:] == ["logging.progress=none", "+tag=a b", f"hydra.run.dir={tmp_path.resolve()}", "checkpoint.resume=auto"]


def test_python_dash_m_and_user_scripts_use_this_interpreter(tmp_path):
    python = _fake_bin(tmp_path, "python")  # a venv's python, off PATH
    as_module = _words(resume_command(tmp_path, [], Launch(CLI_FILE, str(python), {"PATH": "/usr/bin"}, str(tmp_path))), tmp_path)
    assert as_module[:3] == [str(python), "-m", "optimus_preflight.cli"]
    on_path = _words(resume_command(tmp_path, [], Launch(CLI_FILE, str(python), {"PATH": str(python.parent)}, str(tmp_path))), tmp_path)
    assert on_path[:3] == ["python", "-m", "optimus_preflight.cli"]
    user = _words(resume_command(tmp_path, [], Launch("train_mine.py", str(python), {"PATH": ""}, str(tmp_path))), tmp_path)
    assert user[:2] == [str(python), str(tmp_path / "train_mine.py")]  # argv[0] was relative to the run's cwd


def test_torchrun_is_resumed_through_torchrun(tmp_path):
    python = _fake_bin(tmp_path, "python")
    torchrun = _fake_bin(tmp_path, "torchrun")
    env = {"PATH": "", "TORCHELASTIC_RUN_ID": "x", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}
    words = _words(resume_command(tmp_path, [], Launch(CLI_FILE, str(python), env, str(tmp_path))), tmp_path)
    assert words[:4] == [str(torchrun), "--nproc-per-node=2", "-m", "optimus_preflight.cli"]


def test_make_train_is_resumed_through_make_with_args_that_survive_the_shell(tmp_path):
    script = _fake_bin(tmp_path, "optimus-train")
    overrides = ["optimizer.lr=0.01", "+tag=a b", "+cost=$5"]
    line = resume_command(tmp_path, overrides, Launch(str(script), sys.executable, {MAKE_DIR_ENV: str(REPO), "PATH": ""}))
    words = shlex.split(line)
    assert words[:4] == ["make", "-C", str(REPO), "train"]
    args = words[4].removeprefix("ARGS=")
    # make turns $$ back into $, then hands ARGS to the shell unquoted.
    assert shlex.split(args.replace("$$", "$")) == [*overrides, f"hydra.run.dir={tmp_path.resolve()}", "checkpoint.resume=auto"]


def test_resuming_drops_the_records_logged_after_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [{"step": s, "loss": 1.0} for s in range(1, 9)] + [{"step": 4, "val_loss": 2.0}, {"note": "no step"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 9, "lo')  # cut short by a kill
    assert drop_records_after(path, 4) == 5
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r.get("step") for r in kept] == [1, 2, 3, 4, 4, None]
    sink = JsonlSink(path, after_step=2)
    sink.write({"step": 3, "loss": 0.5})
    sink.close()
    assert [json.loads(line).get("step") for line in path.read_text().splitlines()] == [1, 2, None, 3]


def _steps(run_dir: Path) -> Counter:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return Counter((r["step"], "val_loss" in r) for r in records if "loss" in r or "val_loss" in r)


SIGNALLING = ("recipe=char_lm_tiny", "logging.progress=none", "recipe._target_=tests.signal_recipe.SelfSignalRecipe",
              "trainer.max_steps=12", "checkpoint.every_n_steps=4", "logging.every_n_steps=1", "trainer.eval_every_n_steps=3")


def _printed_command(output: str) -> str:
    lines = output.splitlines()
    marker = next(i for i, line in enumerate(lines) if "Resume with" in line)
    tail = lines[marker].split("Resume with:", 1)[1].strip()
    return tail or lines[marker + 1].strip()


def _run_printed(command: str, cwd: Path) -> subprocess.CompletedProcess:
    # The user's shell: no SIGNAL_* plan, and PATH without the venv (a fresh terminal).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIGNAL_", "MAKE", "MFLAGS", MAKE_DIR_ENV))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if Path(p).resolve() != Path(sys.executable).parent.resolve())
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_double_ctrl_c_run_resumes_with_the_printed_command_and_logs_each_step_once(tmp_path):
    run_dir = tmp_path / "run"
    env = {"SIGNAL_NAME": "SIGINT", "SIGNAL_PHASE": "train", "SIGNAL_AT": "6", "SIGNAL_REPEAT": "2"}
    stopped = run_cli(run_dir, *SIGNALLING, cwd=REPO, env=env)
    assert stopped.returncode == 130, stopped.output
    line = next(line for line in stopped.stderr.splitlines() if "interrupted twice" in line)
    assert str(run_dir / "checkpoints" / "step_00000004") in line
    assert stopped.summary()["status"] == "interrupted"
    logged_past_checkpoint = max(step for step, _ in _steps(run_dir))
    assert logged_past_checkpoint > 4  # the flush on the way out kept them: the resume must drop them
    command = line.split("Resume with:", 1)[1].strip()
    resumed = _run_printed(command, cwd=tmp_path)  # another directory than the run's
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from"].endswith("step_00000004")
    counts = _steps(run_dir)
    assert {key for key, n in counts.items() if n > 1} == set(), counts
    assert sorted(step for step, val in counts if not val) == list(range(1, 13))


@pytest.mark.slow
def test_a_run_started_by_make_train_resumes_with_the_printed_make_command(tmp_path):
    """`make train` (the README's command): the printed command is a make command that
    runs from any directory; the single Ctrl+C path drops nothing it must keep."""
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    env.update(SIGNAL_NAME="SIGINT", SIGNAL_PHASE="train", SIGNAL_AT="6", PYTHONUNBUFFERED="1")
    args = " ".join([*SIGNALLING, f"hydra.run.dir={run_dir}"])
    stopped = subprocess.run(["make", "-s", "-C", str(REPO), "train", f"ARGS={args}"], env=env, capture_output=True, text=True, timeout=300)
    assert stopped.returncode != 0 and "stopped by SIGINT at step 6" in stopped.stdout + stopped.stderr, stopped.stdout + stopped.stderr
    command = _printed_command(stopped.stdout + stopped.stderr)
    assert shlex.split(command)[:4] == ["make", "-C", str(REPO), "train"]
    resumed = _run_printed(command, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"].endswith("step_00000006")
    counts = _steps(run_dir)
    assert {key for key, n in counts.items() if n > 1} == set(), counts
