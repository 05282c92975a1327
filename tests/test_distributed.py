"""torchrun with two CPU processes (gloo): same losses as one process, one run dir,
a signal to one rank stops both at the same step with a usable checkpoint, and a rank
that stops answering (SIGSTOP) is named instead of holding the others."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from optimus_preflight.checkpoint import verify
from optimus_preflight.config.validate import validate_config
from optimus_preflight.errors import UserError
from optimus_preflight.training.peers import STALLED, Peers, PeersUnresponsive, StuckWatchdog
from tests.conftest import REPO, run_cli, tiny_config

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


def _wait_for(condition, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("stopped", ["mid_training", "at_the_save_barrier"])
def test_a_stopped_rank_does_not_hold_the_other_and_is_named(tmp_path, stopped):
    """Rank 1 is SIGSTOPped (by the test mid-training, or by itself as it enters a save,
    so rank 0 waits for it at the barrier); SIGTERM to rank 0 must end rank 0 within
    checkpoint.stop_timeout_s plus a generous margin, naming rank 1, with a checkpoint
    of its last step."""
    run_dir, pid_dir, log_path = tmp_path / "run", tmp_path / "pids", tmp_path / "torchrun.log"
    pid_dir.mkdir()
    stop_timeout_s = 3
    overrides = [*TINY, "trainer.max_steps=100000", "checkpoint.every_n_steps=5", f"checkpoint.stop_timeout_s={stop_timeout_s}", "preflight.enabled=false"]
    env = {**os.environ, "PID_DIR": str(pid_dir), **({"STOP_AT_SAVE_RANK": "1"} if stopped == "at_the_save_barrier" else {})}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "optimus_preflight.cli", f"hydra.run.dir={run_dir}", *overrides]
    with open(log_path, "w") as log:  # a file, not a pipe: a full pipe would block the ranks
        launcher = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    ranks: list[psutil.Process] = []
    try:
        pid_files = [pid_dir / f"rank{rank}.pid" for rank in (0, 1)]
        _wait_for(lambda: launcher.poll() is not None or all(p.exists() and p.read_text() for p in pid_files), 120, "both ranks to train")
        assert launcher.poll() is None, log_path.read_text()[-3000:]
        ranks = [psutil.Process(int(p.read_text())) for p in pid_files]
        if stopped == "mid_training":
            ranks[1].suspend()
        _wait_for(lambda: ranks[1].status() == psutil.STATUS_STOPPED, 120, "rank 1 to stop")
        ranks[0].send_signal(signal.SIGTERM)
        try:
            ranks[0].wait(timeout=stop_timeout_s + 60)
        except psutil.TimeoutExpired:
            pytest.fail(f"rank 0 still running {stop_timeout_s + 60} s after SIGTERM:\n{log_path.read_text()[-3000:]}")
    finally:
        for rank in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.kill()  # SIGKILL ends a stopped process too
        launcher.wait(timeout=120)
    output = log_path.read_text()
    assert "exitcode  : 2" in output, output[-3000:]  # rank 0's own code, in torchrun's report
    message = next((line for line in output.splitlines() if "rank 1 did not answer" in line), None)
    assert message is not None, output[-3000:]
    assert "checkpoint.stop_timeout_s" in message and "checkpoint.resume=auto" in message
    assert "Timed out waiting" not in output  # gloo's own timeout, which names no rank
    saved = Path(re.search(r"Rank 0 saved checkpoint (\S+)\.", message).group(1))
    assert verify(saved)["step"] == json.loads((run_dir / "summary.json").read_text())["steps"] > 0


STALLING = ("recipe=char_lm_tiny", "preflight.enabled=false", "logging.progress=none", "trainer.max_steps=12",
            "checkpoint.every_n_steps=4", "recipe._target_=tests.data_fault_recipes.FaultyDataRecipe",
            "data.fetch_timeout_s=10", "data.batch_size=8")


@pytest.mark.slow
@pytest.mark.parametrize("strategy,stalled_rank", [("ddp", 0), ("ddp", 1), ("fsdp", 1)])
def test_one_ranks_data_stall_stops_every_rank_with_rank_0s_checkpoint(tmp_path, strategy, stalled_rank):
    """The stalled rank's data watchdog fires while its peer waits for it in the step's
    gradient collective (its heartbeat goes on, so it is not silent): every rank must exit
    2 within a bound, naming the stalled rank and its frame, with rank 0's checkpoint of
    the last step (under FSDP, which needs every rank's shard: the last one on disk), and
    the resume must end where an uninterrupted run ends."""
    run_dir = tmp_path / "run"
    overrides = (*STALLING, f"trainer.strategy={strategy}")
    # Each rank reads 8 samples a step: read 50 is in step 7, so the boundary is step 6.
    started = time.monotonic()
    stalled = torchrun(run_dir, *overrides, env={"STALL_AT_READ": "50", "STALL_RANK": str(stalled_rank)})
    elapsed = time.monotonic() - started
    assert stalled.stderr.count("exitcode  : 2") == 2, stalled.stderr[-3000:]
    output = stalled.stdout + stalled.stderr
    assert f"data.fetch_timeout_s: rank {stalled_rank}: no training batch within 10 s: the main process blocks at" in output
    assert "time.sleep(HANG_S)" in output and "Connection closed" not in output, output[-3000:]
    assert elapsed < 240, f"{elapsed:.0f} s: a stalled rank held the job"  # a generous bound; it hung for good before
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == 6
    assert f"rank {stalled_rank}: no training batch within 10 s" in summary["stop_reason"]
    saved_step = 6 if strategy == "ddp" else 4
    if strategy == "fsdp":  # the stalled rank cannot write its shard, and its summary gathers none
        assert f"the last one on disk is {run_dir / 'checkpoints' / 'step_00000004'}" in output, output[-3000:]
        assert not (run_dir / "checkpoints" / "step_00000006").exists()
    assert verify(run_dir / "checkpoints" / f"step_{saved_step:08d}")["step"] == saved_step
    if stalled_rank == 1:  # rank 0 saved from its watchdog thread, its main thread inside step 7
        resumed = torchrun(run_dir, *overrides, "checkpoint.resume=auto")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        reference = torchrun(tmp_path / "reference", *overrides)
        assert reference.returncode == 0, reference.stderr[-3000:]
        final, expected = (json.loads((d / "summary.json").read_text()) for d in (run_dir, tmp_path / "reference"))
        assert final["steps"] == 12 and final["params_sha256"] == expected["params_sha256"]
        assert final["resumed_from"].endswith(f"step_{saved_step:08d}")


# ------------------------------------------------------------------ components (fast)
@pytest.fixture
def store():
    from datetime import timedelta

    import torch.distributed as torch_dist

    return torch_dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10), wait_for_workers=False)


def _in_thread(function, *args, **kwargs):
    result = {}

    def target():
        try:
            result["value"] = function(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            result["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def _forever(seconds=60.0, key="trainer.dist_timeout_s"):
    return lambda: (seconds, key)


def test_gather_collects_every_ranks_value_round_after_round(store):
    ranks = [Peers(store, rank, 2, timeout_s=60) for rank in (0, 1)]
    for round_values in ([0, 15], [0, 0]):
        thread, result = _in_thread(ranks[1].gather, round_values[1], during="test", bound=_forever())
        assert ranks[0].gather(round_values[0], during="test", bound=_forever()) == round_values
        thread.join(10)
        assert result["value"] == round_values


def test_gather_names_the_ranks_that_never_post(store):
    lonely = Peers(store, 0, 3, timeout_s=60)
    with pytest.raises(PeersUnresponsive) as caught:  # a 0.3 s bound: it does not wait for ever
        lonely.gather(0, during="the stop agreement", bound=_forever(0.3, "checkpoint.stop_timeout_s"))
    assert caught.value.ranks == [1, 2]
    assert "ranks 1, 2 did not answer the stop agreement" in str(caught.value) and "checkpoint.stop_timeout_s" in str(caught.value)


def test_a_stop_request_shortens_a_wait_already_under_way(store):
    stopping = threading.Event()
    peers = Peers(store, 0, 2, timeout_s=600)
    bound = lambda: (0.2, "checkpoint.stop_timeout_s") if stopping.is_set() else (600.0, "trainer.dist_timeout_s")  # noqa: E731
    threading.Timer(0.3, stopping.set).start()
    with pytest.raises(PeersUnresponsive, match="checkpoint.stop_timeout_s"):
        peers.gather(0, during="the barrier", bound=bound)


def test_heartbeat_tells_a_silent_peer_from_a_live_one(store):
    observer, live = Peers(store, 0, 3, timeout_s=60), Peers(store, 1, 3, timeout_s=60)
    live.start_heartbeat(period_s=0.05)
    try:
        assert observer.stale_ranks(older_than_s=0.3) == []  # first look: nothing known yet
        time.sleep(1.0)  # the live peer beats about 20 times meanwhile
        assert observer.stale_ranks(older_than_s=0.3) == [2]
    finally:
        live.stop()


class _SilentPeer:
    def stale_ranks(self, older_than_s):
        return [1]


def test_watchdog_reports_a_main_thread_parked_in_a_cpp_call():
    done = torch.futures.Future()
    reports = []

    def on_stuck(ranks, stuck_s):
        reports.append(ranks)
        done.set_result(None)

    threading.Timer(30, lambda: done.done() or done.set_result(None)).start()
    watchdog = StuckWatchdog(_SilentPeer(), lambda: 0.3, on_stuck, period_s=0.05, stale_after_s=0.1)
    watchdog.start()
    try:
        done.wait()  # like DDP's all-reduce waiting for a stopped peer
    finally:
        watchdog.stop()
    assert reports == [[1]]  # the watchdog, not the 30 s guard timer, ended the wait


def test_watchdog_reports_a_peer_whose_data_stalled_without_waiting_for_the_bound(store):
    """The stalled peer's heartbeat goes on: only its announcement tells the others, who
    wait for it in a collective; the process-group bound (here 600 s) is not waited out."""
    observer, stalled = Peers(store, 0, 2, timeout_s=600), Peers(store, 1, 2, timeout_s=600)
    stalled.announce(STALLED, "no training batch within 10 s: the main process blocks at ...")
    done = torch.futures.Future()
    reports = []

    def on_peer_stalled(ranks):
        reports.append(ranks)
        done.set_result(None)

    threading.Timer(30, lambda: done.done() or done.set_result(None)).start()
    watchdog = StuckWatchdog(observer, lambda: 600.0, lambda ranks, s: reports.append(("stuck", ranks)),
                             period_s=0.05, stale_after_s=0.1, on_peer_stalled=on_peer_stalled)
    watchdog.start()
    try:
        done.wait()
    finally:
        watchdog.stop()
    assert reports == [{1: "no training batch within 10 s: the main process blocks at ..."}]
    assert stalled.wait_for(STALLED, [0], timeout_s=0.1) == {}  # rank 0 announced nothing


def test_watchdog_leaves_a_main_thread_that_moves_alone():
    reports = []
    watchdog = StuckWatchdog(_SilentPeer(), lambda: 0.5, lambda ranks, s: reports.append(ranks), period_s=0.1, stale_after_s=0.2)
    watchdog.start()
    try:
        until = time.monotonic() + 1.5
        while time.monotonic() < until:  # computing, or polling the store in Peers.gather
            sum(range(1000))
    finally:
        watchdog.stop()
    assert reports == []


@pytest.mark.parametrize("override", ["trainer.dist_timeout_s=0", "checkpoint.stop_timeout_s=-1", "trainer.dist_timeout_s=inf"])
def test_timeouts_must_be_positive_and_finite(override):
    with pytest.raises(UserError, match=override.split("=")[0]):
        validate_config(tiny_config(override))


@pytest.mark.slow
def test_ignored_stop_signals_reach_no_other_thread_either():
    """leave_together's guard: a SIGTERM sent to the process once its work is done must
    not kill it through a thread other than the main one (gloo's, the heartbeat's), as
    a signal only blocked on the main thread would."""
    script = (
        "import os, signal, sys, threading, time\n"
        "from optimus_preflight.training.distributed import ignore_stop_signals\n"
        # Started first, as gloo's and the heartbeat's threads are: a thread inherits
        # the signal mask it was started under, not one set later.
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "ignore_stop_signals()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.exit(7)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 7, result.stderr
