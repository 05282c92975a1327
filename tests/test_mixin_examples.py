"""The README's mixin examples, run as printed, and the standalone loop through real
signals: a stop wherever it lands ends the process with 128+signal and no traceback,
and running the same command again ends with the weights of an uninterrupted run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

EXAMPLE = re.compile(r"<!-- example: (?P<name>[\w.]+) -->\n```python\n(?P<code>.*?)```", re.S)


def readme_examples() -> dict[str, str]:
    return {m["name"]: m["code"] for m in EXAMPLE.finditer((REPO / "README.md").read_text())}


def _write(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text(readme_examples()[name])
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


class Process:
    """A program whose stdout is read line by line: the tests wait for what it says."""

    def __init__(self, argv: list[str]):
        self.popen = subprocess.Popen(argv, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []

    def wait_for(self, text: str) -> None:
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))
            if self.lines[-1].startswith(text):
                return
        raise AssertionError(f"the program ended before printing {text!r}: {self.finish()}")

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        out, err = self.popen.communicate(timeout=timeout)
        self.lines += out.splitlines()
        return self.popen.returncode, "\n".join(self.lines), err


def run(argv: list[str]) -> tuple[int, str, str]:
    return Process(argv).finish()


def _weights(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("weights"))


def test_the_readme_has_each_mixin_alone_and_all_four_together():
    assert set(readme_examples()) >= {"context_alone.py", "iteration_alone.py", "interruption_alone.py",
                                      "preflight_alone.py", "all_four.py"}


@pytest.mark.slow
@pytest.mark.parametrize("name, expected", [("context_alone.py", r"^bf16 "), ("iteration_alone.py", r"^loss \d"),
                                            ("preflight_alone.py", r"^passed$")])
def test_the_examples_without_checkpoints_run_as_printed(tmp_path, name, expected):
    code, out, err = run([sys.executable, str(_write(tmp_path, name))])
    assert code == 0, err
    assert re.search(expected, out.strip().splitlines()[-1]), out


@pytest.mark.slow
@pytest.mark.parametrize("name, signum, at, args", [
    ("interruption_alone.py", signal.SIGTERM, "step 60 ", []),
    ("all_four.py", signal.SIGINT, "step 150", ["300"]),
])
def test_the_checkpointing_examples_stop_on_a_signal_and_resume_bit_exact(tmp_path, name, signum, at, args):
    script = str(_write(tmp_path, name))
    code, whole, err = run([sys.executable, script, str(tmp_path / "whole"), *args])
    assert code == 0, err
    stopped = Process([sys.executable, script, str(tmp_path / "stopped"), *args])
    stopped.wait_for(at)
    stopped.popen.send_signal(signum)
    code, out, err = stopped.finish()
    assert code == 128 + signum, err
    assert "Traceback" not in err and "Resume with:" in err
    assert any((tmp_path / "stopped" / "checkpoints").glob("step_*"))
    code, resumed, err = run([sys.executable, script, str(tmp_path / "stopped"), *args])
    assert code == 0 and "Traceback" not in err, err
    assert _weights(resumed) == _weights(whole)


def _loop(run_dir: Path, steps: int = 24, **env: str) -> Process:
    os.environ.update(env)
    try:
        return Process([sys.executable, "-m", "tests.standalone_loop", str(run_dir), str(steps)])
    finally:
        for key in env:
            os.environ.pop(key)


@pytest.mark.slow
@pytest.mark.parametrize("where, env, announce", [
    ("in a DataLoader that never delivers", {"HANG_AT_SAMPLE": "40"}, "hanging"),
    ("in the user's own code between steps", {"PAUSE_AT_STEP": "7"}, "pausing"),
])
def test_a_stop_anywhere_in_a_users_loop_checkpoints_and_resumes_bit_exact(tmp_path, where, env, announce):
    code, whole, err = _loop(tmp_path / "whole").finish()
    assert code == 0, err
    stopped = _loop(tmp_path / "run", **env)
    stopped.wait_for(announce)
    stopped.popen.send_signal(signal.SIGINT)
    if announce == "pausing":  # the user's code goes on until it returns to the loop
        stopped.wait_for("stop seen")
        (tmp_path / "run" / "go").write_text("")
    code, out, err = stopped.finish()
    assert code == 130, err
    assert "Traceback" not in err, err
    assert "stopped by SIGINT" in err and "Resume with:" in err
    code, resumed, err = _loop(tmp_path / "run").finish()
    assert code == 0, err
    assert _weights(resumed) == _weights(whole)
