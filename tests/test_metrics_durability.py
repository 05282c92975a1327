"""A SIGKILL (the OOM killer) loses no history: the metric records up to a checkpoint
are on disk when the checkpoint is, and a resumed run logs every step exactly once."""

from __future__ import annotations

import json
import signal

import pytest

from tests.conftest import REPO, run_cli

# Nothing reaches the disk by the timer, and the records of a few steps fit in the file's
# buffer: without the checkpoint's sync a SIGKILL loses them all.
TINY = ("recipe=char_lm_tiny", "preflight.enabled=false", "logging.progress=none", "trainer.max_steps=20",
        "checkpoint.every_n_steps=5", "logging.every_n_steps=1", "trainer.eval_every_n_steps=5",
        "logging.flush_every_s=100000")


def _steps(run_dir) -> list[int]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if "loss" in r]


@pytest.mark.slow
@pytest.mark.parametrize("when, step, last_checkpoint", [("step_end", 13, 10), ("checkpoint", 10, 10), ("eval", 10, 5)])
def test_a_sigkill_then_a_resume_logs_every_step_exactly_once(tmp_path, when, step, last_checkpoint):
    run_dir = tmp_path / "run"
    kill = f"+callbacks=[{{_target_:tests.kill_callbacks.KillOnce,step:{step},when:{when}}}]"
    killed = run_cli(run_dir, *TINY, kill, cwd=REPO)
    assert killed.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), killed.output
    # The records up to the last checkpoint are durable (the timer never flushed).
    assert _steps(run_dir)[:last_checkpoint] == list(range(1, last_checkpoint + 1))
    resumed = run_cli(run_dir, *TINY, kill, cwd=REPO)
    assert resumed.returncode == 0, resumed.output
    assert _steps(run_dir) == list(range(1, 21))
