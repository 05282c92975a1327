"""The SLURM path on submitit's local executor: pre-timeout signal -> checkpoint ->
requeue -> automatic resume in the same job dir."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher (the [slurm] extra) is not installed")


def _job_process(parent: psutil.Process, deadline: float) -> psutil.Process:
    while time.monotonic() < deadline:
        for child in parent.children(recursive=True):
            try:
                if "submitit.core._submit" in " ".join(child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.1)
    raise AssertionError("submitit never started the job")


@pytest.mark.slow
def test_signal_before_the_time_limit_requeues_and_resumes(tmp_path):
    sweep_dir = tmp_path / "sweep"
    command = [
        sys.executable, "-m", "optimus_preflight.cli", "-m", "hydra/launcher=local_submitit",
        "recipe=char_lm_tiny", "logging.progress=none", "trainer.max_steps=400", "logging.every_n_steps=10",
        "trainer.eval_every_n_steps=200", f"hydra.sweep.dir={sweep_dir}",
    ]
    launcher = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Bounds against a hang only (the flow takes ~20 s idle): the steps wait for events.
    deadline = time.monotonic() + 600
    job = _job_process(psutil.Process(launcher.pid), deadline)
    metrics = sweep_dir / "0" / "metrics.jsonl"
    while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.1)
    job.send_signal(signal.SIGUSR1)  # what SLURM sends signal_delay_s before the limit
    output, _ = launcher.communicate(timeout=600)
    assert launcher.returncode == 0, output

    summary = json.loads((sweep_dir / "0" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 400
    assert "/0/checkpoints/step_" in summary["resumed_from"]
    job_logs = "".join(p.read_text() for p in (sweep_dir / ".submitit").rglob("*.out"))
    assert "received SIGUSR1" in job_logs and "Requeued job" in job_logs and "resumed from" in job_logs
