"""The preflight console: a count instead of a line per passed check, skips collapsed by
reason, the memory verdict as a table, a live line while a check runs, and a verdict that
says what happens where the preflight runs (a recipe, or a loop of the user's own)."""

from __future__ import annotations

import io
import logging
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.errors import PreflightFailed
from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.framework import Check, CheckResult, CheckStatus, Stage
from optimus_preflight.preflight.framework import live as live_module
from optimus_preflight.preflight.framework.console import format_report
from optimus_preflight.preflight.framework.live import LiveCheckLine
from optimus_preflight.preflight.framework.report import PreflightReport

GIB = 2**30
# Generous bounds on events that come within milliseconds; never a performance claim.
EVENT_WAIT_S = 60.0
META = ("the model is on the meta device (too large for this machine's RAM, so it will not train here): "
        "only the memory verdict and the data checks run")


def result(name: str, status: CheckStatus = CheckStatus.PASSED, **data) -> CheckResult:
    detail = data.pop("detail", None)
    return CheckResult(name, Stage.STEP, status, 0.01, data=data, detail=detail)


def test_skips_for_one_reason_are_one_line():
    skipped = [result(f"step.check_{index}", CheckStatus.SKIPPED, detail=META) for index in range(20)]
    report = PreflightReport([result("data.first_batch"), *skipped], 1.0)
    lines = format_report(report).splitlines()
    assert lines[0] == "preflight: 21 checks: 1 passed, 20 skipped (1.0 s)"
    assert [line for line in lines if "skipped" in line and META in line] == [f"  skipped 20 checks: {META}"]
    assert len(lines) == 3  # the count, the skips, the verdict
    verbose = format_report(report, verbose=True).splitlines()
    assert sum(line.split()[0] == "skip" for line in verbose[1:-1]) == 20


def test_the_memory_verdict_is_a_table_with_the_strategy_and_ranks():
    vram = result("memory.vram_headroom", CheckStatus.ERROR, parameters_bytes=24 * GIB, gradients_bytes=48 * GIB,
                  optimizer_state_bytes=48 * GIB, activations_bytes=0, peak_bytes=120 * GIB,
                  need_bytes=int(144.3 * GIB), limit_bytes=int(75.5 * GIB), strategy="ddp", world_size=8)
    lines = format_report(PreflightReport([vram], 2.0)).splitlines()
    start = lines.index("memory at the predicted peak:")
    header, titles, values = lines[start + 1 : start + 4]
    assert header == "  memory.vram_headroom, ddp, per rank of 8:"
    assert titles.split() == ["parameters", "gradients", "optimizer", "state", "activations", "other", "peak", "limit",
                              "used"]
    assert values.split() == ["24.00", "GiB", "48.00", "GiB", "48.00", "GiB", "0", "B", "24.30", "GiB", "144.30", "GiB",
                              "75.50", "GiB", "191%"]


def test_a_memory_check_without_an_estimate_has_no_table():
    report = PreflightReport([result("memory.vram_headroom", summary="no GPU to check")], 0.5)
    assert "memory at the predicted peak:" not in format_report(report)


# ------------------------------------------------------------------ the live line
class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_a_long_check_says_it_is_still_running():
    said: list[str] = []
    spoke = threading.Event()
    clock = FakeClock()

    def say(line: str) -> None:
        said.append(line)
        spoke.set()

    live = LiveCheckLine(terminal=None, every_s=60.0, redraw_s=0.005, clock=clock, say=say)
    with live.running("step.overfit"):
        assert not spoke.wait(0.05)  # nothing for a check shorter than every_s
        clock.now += 61
        assert spoke.wait(EVENT_WAIT_S)
    assert said == ["preflight: still running step.overfit (61 s)"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_running_check_is_a_status_line_erased_when_it_ends():
    terminal = Terminal()
    clock = FakeClock()
    live = LiveCheckLine(terminal=terminal, redraw_s=0.005, clock=clock)
    with live.running("data.first_batch"):
        clock.now += 12
        for _ in range(int(EVENT_WAIT_S / 0.01)):
            if "preflight: running data.first_batch (12 s)" in terminal.getvalue():
                break
            threading.Event().wait(0.01)
        assert "preflight: running data.first_batch (12 s)" in terminal.getvalue()
    assert terminal.getvalue().rsplit("\r", 1)[-1].strip() == ""  # the line is cleared, nothing left on it


class WaitsForItsLiveLine(Check):
    """A slow check: it ends once the console has said it is still running."""

    name = "test.slow"
    stage = Stage.STEP
    seen = threading.Event()

    def run(self, ctx, findings):
        assert self.seen.wait(EVENT_WAIT_S)
        findings.data["summary"] = "waited"


class Seen(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if "still running test.slow" in record.getMessage():
            WaitsForItsLiveLine.seen.set()


def test_run_preflight_says_which_check_is_running(monkeypatch, caplog):
    monkeypatch.setattr(live_module, "STILL_RUNNING_EVERY_S", 0.01)
    monkeypatch.setattr(live_module, "REDRAW_EVERY_S", 0.005)
    handler = Seen()
    logging.getLogger("optimus_preflight").addHandler(handler)
    model, optimizer, loader, loss_fn = plain_loop()
    try:
        with caplog.at_level(logging.INFO, logger="optimus_preflight"):
            report = run_preflight(model, optimizer, loader, loss_fn=loss_fn, checks=[WaitsForItsLiveLine()])
    finally:
        logging.getLogger("optimus_preflight").removeHandler(handler)
    assert report.check("test.slow").data["summary"] == "waited"


# ------------------------------------------------------------------ the verdict where it runs
def plain_loop(detached: bool = False):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))

    def loss_fn(model, batch):
        loss = F.cross_entropy(model(batch[0]), batch[1])
        return loss.detach() if detached else loss

    return model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=16, shuffle=True), loss_fn


def verdict(caplog) -> str:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("preflight FAILED")][-1]


def test_a_failed_verdict_in_a_loop_of_ones_own_says_what_happens_there(caplog):
    model, optimizer, loader, loss_fn = plain_loop(detached=True)
    checks = [FirstBatchCheck(), FirstStepCheck()]
    with caplog.at_level(logging.INFO, logger="optimus_preflight"):
        report = run_preflight(model, optimizer, loader, loss_fn=loss_fn, checks=checks)
    assert report.failed
    assert "nothing stops your loop" in verdict(caplog) and "will not start" not in verdict(caplog)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="optimus_preflight"), pytest.raises(PreflightFailed):
        run_preflight(model, optimizer, loader, loss_fn=loss_fn, checks=checks, raise_on_failure=True)
    assert "run_preflight raises PreflightFailed" in verdict(caplog)


def test_verbose_run_preflight_lists_every_check(caplog):
    model, optimizer, loader, loss_fn = plain_loop()
    with caplog.at_level(logging.INFO, logger="optimus_preflight"):
        run_preflight(model, optimizer, loader, loss_fn=loss_fn, checks=[FirstBatchCheck(), FirstStepCheck()],
                      verbose=True)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.split()[:2] == ["ok", "step.first_step"] for line in lines)
