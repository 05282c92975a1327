"""Shared fixtures: composed configs of the tiny recipe and a CLI runner."""

from __future__ import annotations

import os

# Tests run two at a time (make test) and mostly start training processes of their own:
# one compute thread each keeps them from fighting over the two cores. Inherited by every
# subprocess a test starts; the tiny models here gain nothing from a second thread.
os.environ["OMP_NUM_THREADS"] = "1"

import atexit  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from optimus_preflight import compose

# The suite sets what it depends on: none of the caller's settings for these tools leaks in
# (a CI with TQDM_DISABLE=1 or HYDRA_FULL_ERROR=1 must see what a terminal user sees).
for _name in ("TQDM_DISABLE", "HYDRA_FULL_ERROR", "COLUMNS", "LINES", "WANDB_MODE", "MLFLOW_TRACKING_URI",
              "OPTIMUS_MAKE_DIR", "PYTHONWARNINGS"):
    os.environ.pop(_name, None)

# Every process the suite starts gets its temporary files in one directory of its own,
# removed when the suite ends: a run that a test kills -9 (torchrun's rendezvous files,
# multiprocessing's pymp-*, DataLoader workers' stack dumps) leaves nothing in the
# machine's /tmp. pytest's own tmp_path root stays where it was (kept for a failed test).
if "OPTIMUS_TESTS_TMPDIR" not in os.environ:
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    _suite_tmp = tempfile.mkdtemp(prefix="optimus-tests-")
    os.environ["OPTIMUS_TESTS_TMPDIR"] = os.environ["TMPDIR"] = _suite_tmp
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    atexit.register(shutil.rmtree, _suite_tmp, ignore_errors=True)

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "optimus_preflight.cli"]


# The files with the longest chains of subprocesses (torchrun, interrupt and resume), in
# about that order. xdist --dist loadfile hands files out in collection order: starting
# these first keeps one of them from being the last file left running alone.
LONGEST_FILES = ("test_fsdp.py", "test_distributed.py", "test_compile.py", "test_resume.py", "test_checkpoint_store.py",
                 "test_sweep.py", "test_submitit.py", "test_storage_failures.py", "test_resume_command.py", "test_cli.py")


def _start_order(item) -> int:
    name = Path(str(item.fspath)).name
    return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_start_order)  # stable: each file keeps its own order
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def tiny_config(*overrides: str):
    """The tiny char-LM recipe, quiet and fast; extra overrides win."""
    return compose(["recipe=char_lm_tiny", "logging.progress=none", *overrides])


@pytest.fixture
def tiny_cfg():
    return tiny_config()


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def metrics(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())


def run_cli(run_dir: Path, *overrides: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None,
            cold: bool = False) -> CliResult:
    """Run `optimus-train` in a process of its own with a fixed run dir: forked from a
    warm launcher (tests/warm_launcher.py), or a plain subprocess with ``cold=True`` (for
    what is about the process start) or OPTIMUS_TESTS_COLD_START=1."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    flags = [o for o in overrides if o.startswith("-")]
    args = [*flags, f"hydra.run.dir={run_dir}", *[o for o in overrides if not o.startswith("-")]]
    cwd = cwd or run_dir.parent
    launcher = None if cold or os.environ.get("OPTIMUS_TESTS_COLD_START") == "1" else _launcher()
    if launcher is None:
        completed = subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
        return CliResult(completed.returncode, completed.stdout, completed.stderr, run_dir)
    returncode, stdout, stderr = launcher.run(args, cwd, full_env, timeout)
    return CliResult(returncode, stdout, stderr, run_dir)


class _WarmLauncher:
    """This test process's warm launcher: started on first use, stopped at exit."""

    def __init__(self):
        self.directory = Path(tempfile.mkdtemp(prefix="optimus-launcher-"))
        self.socket_path = str(self.directory / "socket")
        self.process = subprocess.Popen([sys.executable, "-m", "tests.warm_launcher", self.socket_path], cwd=REPO,
                                        stdout=subprocess.PIPE, text=True)
        atexit.register(self.stop)
        ready = self.process.stdout.readline().split()
        # Forking is safe only from a process with one thread; otherwise runs start cold.
        self.usable = ready == ["ready", "1"]
        if not self.usable:
            warnings.warn(f"the warm launcher is not usable ({ready}): CLI runs start plain processes", stacklevel=2)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)

    def run(self, args: list[str], cwd: Path, env: dict, timeout: float) -> tuple[int, str, str]:
        out, err = self.directory / f"{uuid.uuid4().hex}.out", self.directory / f"{uuid.uuid4().hex}.err"
        request = {"argv": args, "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}
        deadline = time.monotonic() + timeout
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(self.socket_path)
            stream = connection.makefile("rwb", buffering=0)
            stream.write((json.dumps(request) + "\n").encode())
            pid = int(stream.readline().split()[1])
            connection.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                line = stream.readline()
            except TimeoutError:
                line = b""
            if not line.startswith(b"exit "):  # out of time: kill it, as subprocess.run does
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired([*CLI, *args], timeout, output=_read(out), stderr=_read(err))
        returncode = int(line.split()[1])
        texts = _read(out), _read(err)
        out.unlink(missing_ok=True)
        err.unlink(missing_ok=True)
        return returncode, *texts


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


_launchers: dict[int, _WarmLauncher] = {}


def _launcher() -> _WarmLauncher | None:
    # One per process (a forked test process must not share its parent's).
    if os.getpid() not in _launchers:
        _launchers[os.getpid()] = _WarmLauncher()
    launcher = _launchers[os.getpid()]
    return launcher if launcher.usable else None


@pytest.fixture
def cli(tmp_path):
    def runner(*overrides: str, run_dir: Path | None = None, **kwargs) -> CliResult:
        return run_cli(run_dir or tmp_path / "run", *overrides, **kwargs)

    return runner
