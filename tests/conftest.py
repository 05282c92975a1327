"""Shared fixtures: composed configs of the tiny recipe and a CLI runner."""

from __future__ import annotations

import os

# Tests run two at a time (make test) and mostly start training processes of their own:
# one compute thread each keeps them from fighting over the two cores. Inherited by every
# subprocess a test starts; the tiny models here gain nothing from a second thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from optimus_preflight import compose

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "optimus_preflight.cli"]


def pytest_collection_modifyitems(config, items):
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


def run_cli(run_dir: Path, *overrides: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None) -> CliResult:
    """Run `optimus-train` in a subprocess with a fixed run dir."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    flags = [o for o in overrides if o.startswith("-")]
    command = [*CLI, *flags, f"hydra.run.dir={run_dir}", *[o for o in overrides if not o.startswith("-")]]
    completed = subprocess.run(command, cwd=cwd or run_dir.parent, capture_output=True, text=True, timeout=timeout, env=full_env)
    return CliResult(completed.returncode, completed.stdout, completed.stderr, run_dir)


@pytest.fixture
def cli(tmp_path):
    def runner(*overrides: str, run_dir: Path | None = None, **kwargs) -> CliResult:
        return run_cli(run_dir or tmp_path / "run", *overrides, **kwargs)

    return runner
