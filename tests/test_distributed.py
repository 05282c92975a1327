"""torchrun with two CPU processes (gloo): same losses as one process, one run dir,
and a signal to one rank stops both at the same step with a usable checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, run_cli

TINY = ("recipe=char_lm_tiny", "logging.progress=none", "trainer.max_steps=10", "trainer.eval_every_n_steps=5", "recipe._target_=tests.signal_recipe.SelfSignalRecipe")


def torchrun(run_dir, *overrides, env=None, nproc=2):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "optimus_preflight.cli", f"hydra.run.dir={run_dir}", *overrides]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ddp") / "run"
    result = torchrun(run_dir, *TINY, "data.batch_size=8")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_two_processes_match_one_process_with_the_same_global_batch(tmp_path, two_process_run):
    single = run_cli(tmp_path / "single", *TINY, "data.batch_size=16", cwd=REPO)
    assert single.returncode == 0, single.output
    ddp, one = metrics(two_process_run), single.metrics()
    assert [r["step"] for r in ddp] == [r["step"] for r in one]
    for a, b in zip(ddp, one):
        key = "loss" if "loss" in b else "val_loss"
        assert a[key] == pytest.approx(b[key], abs=1e-4)
    # Global throughput counts both ranks' samples.
    assert all(r["samples_per_s"] > 0 for r in ddp if "loss" in r)
    # One run dir, one metrics file, written by rank 0 only.
    siblings = [p for p in two_process_run.parent.iterdir() if p.is_dir()]
    assert siblings == [two_process_run]
    assert sorted(p.name for p in two_process_run.glob("*.jsonl")) == ["metrics.jsonl"]
    assert json.loads((two_process_run / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_both_at_one_step_and_resume_matches(tmp_path, two_process_run):
    run_dir = tmp_path / "run"
    signal_env = {"SIGNAL_NAME": "SIGTERM", "SIGNAL_PHASE": "train", "SIGNAL_AT": "4", "SIGNAL_RANK": "1"}
    stopped = torchrun(run_dir, *TINY, "data.batch_size=8", env=signal_env)
    # torchrun itself exits 1 when workers fail; each worker's own code is in its report.
    assert stopped.stderr.count("exitcode  : 143") == 2, stopped.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == 4
    assert (run_dir / "checkpoints" / "step_00000004").is_dir()

    resumed = torchrun(run_dir, *TINY, "data.batch_size=8")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = json.loads((run_dir / "summary.json").read_text())
    reference = json.loads((two_process_run / "summary.json").read_text())
    assert final["steps"] == 10 and final["params_sha256"] == reference["params_sha256"]
    losses = {(r["step"], "loss" in r): r.get("loss", r.get("val_loss")) for r in metrics(run_dir)}
    assert losses == {(r["step"], "loss" in r): r.get("loss", r.get("val_loss")) for r in metrics(two_process_run)}
