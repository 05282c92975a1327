"""A console whose reader is gone (`optimus-train ... | head -1`, a closed terminal) ends
the console output quietly; the run and its files go on (issue 29, part D)."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import subprocess
import sys

import pytest

from optimus_preflight.reporting.progress import Progress
from optimus_preflight.reporting.run_log import ConsoleHandler
from tests.conftest import CLI


class GoneStream(io.StringIO):
    """A console stream whose every write fails as a dead pipe or terminal does."""

    def __init__(self, code: int):
        super().__init__()
        self.code = code
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        raise OSError(self.code, os.strerror(self.code))

    def flush(self) -> None:
        raise OSError(self.code, os.strerror(self.code))


@pytest.mark.parametrize("code", [errno.EPIPE, errno.EIO])
def test_the_console_handler_stops_quietly_and_the_file_keeps_every_record(capsys, code):
    stream = GoneStream(code)
    console = ConsoleHandler(stream)
    file_records: list[str] = []
    file_handler = logging.Handler()
    file_handler.emit = lambda record: file_records.append(record.getMessage())
    logger = logging.getLogger(f"test_console_gone_{code}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.handlers = [console, file_handler]
    for step in range(40):
        logger.info("step %d", step)
    assert console.console_is_gone
    assert stream.writes == 1  # no retry per record
    assert "Logging error" not in capsys.readouterr().err
    assert file_records == [f"step {step}" for step in range(40)]


def test_an_unrelated_write_error_is_still_reported(capsys):
    stream = GoneStream(errno.EINVAL)
    logger = logging.getLogger("test_console_gone_einval")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.handlers = [ConsoleHandler(stream)]
    logger.info("hello")
    assert "Logging error" in capsys.readouterr().err


@pytest.mark.parametrize("code", [errno.EPIPE, errno.EIO])
def test_a_bar_on_a_gone_terminal_ends_and_the_step_lines_go_on(monkeypatch, code):
    monkeypatch.setattr(sys, "stderr", GoneStream(code))
    logger = logging.getLogger("optimus_preflight")
    level = logger.level
    logger.setLevel(logging.INFO)  # setLevel, not an attribute: it also clears logging's cache of levels
    try:
        progress = Progress("bar", total_steps=10)
        for step in range(1, 11):
            progress.advance()
            progress.report({"step": step, "loss": 1.0, "lr": 1e-3})
        progress.close()  # no exception: the bar ended, the run did not
    finally:
        logger.setLevel(level)


@pytest.mark.slow
def test_a_run_piped_into_head_completes_without_logging_errors(tmp_path):
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [*CLI, "recipe=char_lm_tiny", "trainer.max_steps=12", "checkpoint.every_n_steps=4", f"hydra.run.dir={run_dir}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout.readline()  # the reader takes one line and leaves, as `| head -1` does
    process.stdout.close()
    stderr = process.stderr.read().decode(errors="replace")
    assert process.wait(timeout=300) == 0, stderr
    assert "Logging error" not in stderr and "BrokenPipeError" not in stderr, stderr
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert "completed after 12 steps" in (run_dir / "train.log").read_text()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) >= 12
