"""What every section gets: the device, the mode, folders, the time budget, and helpers to run
the recipe CLI in a process of its own and to capture the toolkit's log."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30


class SectionTimeout(Exception):
    """A section ran past its budget (raised by SIGALRM in the main thread)."""


@dataclass
class Context:
    out_dir: Path
    work_dir: Path
    tiny: bool
    cuda: bool
    no_cuda_reason: str
    # --rehearse: without CUDA, the sections that go through the CLI run on the CPU instead, to
    # try their plumbing (overrides, run files, analysis); their results are no GPU result.
    rehearse: bool = False
    deadline: float = 0.0  # monotonic time the current section must be done by
    log_lines: list[str] = field(default_factory=list)

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0) if self.cuda else torch.device("cpu")

    @property
    def cli_device(self) -> str:
        return "cuda" if self.cuda else "cpu"

    def runs_cli(self, section: Any) -> bool:
        """Whether a CLI section runs: on CUDA, or as a CPU rehearsal; else it is skipped."""
        if self.cuda:
            return True
        if self.rehearse:
            section.notes.append("CPU REHEARSAL (--rehearse): the runs used trainer.device=cpu; not a GPU result.")
            return True
        section.skip(self.no_cuda_reason or "no CUDA")
        return False

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def has_time(self, needed_s: float) -> bool:
        return self.left() > needed_s

    def say(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        self.log_lines.append(line)
        print(line, flush=True)

    def folder(self, name: str) -> Path:
        path = self.work_dir / name
        path.mkdir(parents=True, exist_ok=True)
        return path


@contextlib.contextmanager
def hard_limit(seconds: float) -> Iterator[None]:
    """SIGALRM raises SectionTimeout in the main thread after ``seconds`` (a section that is
    stuck in Python code, e.g. a loop of estimates; a blocked C call is freed by its own
    timeout, e.g. the subprocess timeouts below)."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise SectionTimeout(f"ran past its hard limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Completed:
    returncode: int | None  # None: killed at its timeout
    output: str
    seconds: float
    run_dir: Path | None = None

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def tail(self, chars: int = 1500) -> str:
        return self.output[-chars:]

    def json_file(self, name: str) -> dict | None:
        if self.run_dir is None or not (self.run_dir / name).is_file():
            return None
        try:
            return json.loads((self.run_dir / name).read_text())
        except ValueError:
            return None

    def metrics(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl" if self.run_dir else None
        if path is None or not path.is_file():
            return []
        records = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
        return records


def run_process(command: list[str], timeout_s: float, env: dict[str, str] | None = None, log_path: Path | None = None,
                run_dir: Path | None = None) -> Completed:
    """Run in a new session; on timeout the whole group is killed (it may hold torchrun's workers)."""
    started = time.monotonic()
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    process = subprocess.Popen(command, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=max(timeout_s, 1.0))
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        code = None
    except BaseException:  # SectionTimeout from the alarm: take the process group down too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(f"$ {' '.join(command)}\n{output}")
    return Completed(code, output, time.monotonic() - started, run_dir)


def run_cli(ctx: Context, name: str, overrides: list[str], timeout_s: float, *, env: dict[str, str] | None = None,
            torchrun: int | None = None) -> Completed:
    """``python -m optimus_preflight.cli`` (or under ``torchrun --nproc_per_node=N``) with a
    fresh run dir under the work dir; cwd is the repo root, so ``recipe._target_`` can name
    ``benchmarks.gpu_checks.recipes.*``."""
    run_dir = ctx.work_dir / "runs" / name
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    launcher = [sys.executable, "-m", "optimus_preflight.cli"]
    if torchrun:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun}",
                    "-m", "optimus_preflight.cli"]
    command = [*launcher, f"hydra.run.dir={run_dir}", "logging.progress=none", *overrides]
    ctx.say(f"  run {name}: {' '.join(overrides)}")
    done = run_process(command, timeout_s, env=env, log_path=ctx.work_dir / "logs" / f"{name}.log", run_dir=run_dir)
    ctx.say(f"  run {name}: exit {done.returncode} in {done.seconds:.1f} s")
    return done


class LogCapture(logging.Handler):
    """The ``optimus_preflight`` logger's records at INFO and above, while in use."""

    def __init__(self, name: str = "optimus_preflight"):
        super().__init__(logging.DEBUG)
        self.logger = logging.getLogger(name)
        self.records: list[logging.LogRecord] = []
        self._level = self.logger.level

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int = logging.INFO) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]

    def __enter__(self) -> LogCapture:
        self.logger.addHandler(self)
        self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self._level)


def error_text(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:400]


def free_cuda() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
