"""With a progress bar on a terminal: log records go through the bar (no frozen copies
of it), and train.log still gets the periodic step and val_loss lines."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

import pytest
from tqdm.contrib.logging import _TqdmLoggingHandler

from optimus_preflight.reporting.progress import Progress
from optimus_preflight.reporting.run_log import log_to_files

log = logging.getLogger("optimus_preflight")


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal_and_log(tmp_path, monkeypatch):
    """The root logger as Hydra's job logging sets it up: a console handler on stdout
    and a file handler (train.log). A function to call in the test body: pytest's own
    capture swaps sys.stdout/sys.stderr back in between a fixture and its test."""

    def attach() -> tuple[FakeTerminal, Path, logging.Logger]:
        terminal = FakeTerminal()
        monkeypatch.setattr(sys, "stdout", terminal)
        monkeypatch.setattr(sys, "stderr", terminal)
        file = logging.FileHandler(tmp_path / "train.log")
        opened.append(file)
        root = logging.getLogger()
        monkeypatch.setattr(root, "handlers", [logging.StreamHandler(sys.stdout), file])
        monkeypatch.setattr(log, "level", logging.INFO)
        return terminal, tmp_path / "train.log", root

    opened: list[logging.Handler] = []
    yield attach
    for handler in opened:
        handler.close()


def visible_lines(stream: str) -> list[str]:
    """What a terminal shows: each carriage return moves back to column 0 and the text
    after it overwrites what is there (tqdm clears with spaces, then redraws)."""
    lines = []
    for raw in stream.split("\n"):
        screen: list[str] = []
        for segment in raw.split("\r"):
            screen[: len(segment)] = list(segment)
        lines.append("".join(screen).rstrip())
    return [line for line in lines if line]


def _record(step: int) -> dict:
    return {"step": step, "loss": 2.5, "lr": 1e-3, "grad_norm": 1.0, "samples_per_s": 100.0}


def test_log_lines_go_through_the_bar_while_it_is_open(terminal_and_log):
    terminal, train_log, root = terminal_and_log()
    original = list(root.handlers)
    progress = Progress("auto", total_steps=20)
    assert progress._bar is not None  # a terminal: the bar is shown
    # tqdm's handler stands in for the console one: it clears the bar, writes, redraws.
    assert [type(h).__name__ for h in root.handlers] == ["FileHandler", "_BarLogHandler"]
    assert isinstance(root.handlers[1], _TqdmLoggingHandler)
    for step in range(1, 21):
        progress.advance()
        if step % 10 == 0:
            progress.report(_record(step))
            log.info("checkpoint checkpoints/step_%08d (0.01 s)", step)
    progress.write("step 20 | val_loss 2.1000")
    progress.close()
    assert root.handlers == original
    written = train_log.read_text()
    assert "step 10/20 | loss 2.5000" in written and "step 20/20" in written  # the step lines
    assert "checkpoint checkpoints/step_00000010" in written and "val_loss 2.1000" in written
    shown = visible_lines(terminal.getvalue())
    assert not any("step 10/20 | loss" in line for line in shown)  # the bar shows those figures
    # Each log line stands alone (no frozen copy of the bar before it), the final bar once.
    assert shown == ["checkpoint checkpoints/step_00000010 (0.01 s)", "checkpoint checkpoints/step_00000020 (0.01 s)",
                     "step 20 | val_loss 2.1000", shown[-1]]
    assert "20/20" in shown[-1] and "loss=2.5000" in shown[-1]


def test_without_a_terminal_the_step_lines_are_plain_log_lines(terminal_and_log, monkeypatch):
    terminal, train_log, root = terminal_and_log()
    monkeypatch.setattr(FakeTerminal, "isatty", lambda self: False)
    progress = Progress("auto", total_steps=20)
    assert progress._bar is None
    progress.report(_record(10))
    progress.close()
    assert "step 10/20 | loss 2.5000" in terminal.getvalue()
    assert "step 10/20 | loss 2.5000" in train_log.read_text()


def test_log_to_files_skips_only_the_console(terminal_and_log):
    terminal, train_log, _ = terminal_and_log()
    try:
        raise RuntimeError("a builder's bug")
    except RuntimeError:
        log_to_files(log, logging.ERROR, "job failed", exc_info=True)
    assert terminal.getvalue() == ""
    written = train_log.read_text()
    assert "job failed" in written and "RuntimeError: a builder's bug" in written and "Traceback" in written
