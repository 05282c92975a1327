"""A DataLoader worker killed mid-run (as by the kernel's OOM killer): one message that
says so and what to try, a checkpoint at the last step boundary, and a resume that
ends where an uninterrupted run ends."""

from __future__ import annotations

import pytest

from optimus_preflight.checkpoint.store import verify
from optimus_preflight.training.worker_deaths import WorkerDeathGuard, WorkerDied, worker_death
from tests.conftest import REPO, run_cli, tiny_config
from tests.worker_kill_recipe import WorkerKillingRecipe

RUN = ("recipe=char_lm_tiny", "logging.progress=none", "trainer.max_steps=12", "checkpoint.every_n_steps=4",
       "data.num_workers=2", "recipe._target_=tests.worker_kill_recipe.WorkerKillingRecipe")


@pytest.mark.slow
def test_a_killed_worker_stops_the_run_at_a_step_boundary_with_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    killed = run_cli(run_dir, *RUN, cwd=REPO, env={"KILL_WORKER_AT_STEP": "6"})
    assert killed.returncode == 2, killed.output
    assert "Traceback" not in killed.output
    assert "out-of-memory killer" in killed.output and "data.num_workers" in killed.output
    assert "resume with" in killed.output.lower() and "checkpoint.resume=auto" in killed.output
    # The worker died in the middle of step 7; torch noticed it in its SIGCHLD handler
    # (or a later fetch did), and the run stopped at the next fetch, a step boundary
    # whose weights it saved: the resume below ends bit-identical to the reference.
    stopped = killed.summary()["steps"]
    assert killed.summary()["status"] == "failed" and 7 <= stopped < 12
    assert f"stopped at step {stopped} with checkpoint" in killed.output
    verify(run_dir / "checkpoints" / f"step_{stopped:08d}")

    cfg = tiny_config(*RUN[2:])
    resumed = WorkerKillingRecipe(cfg, run_dir=run_dir).run()
    reference = WorkerKillingRecipe(cfg, run_dir=tmp_path / "reference").run()
    assert resumed["params_sha256"] == reference["params_sha256"] and resumed["steps"] == 12


@pytest.mark.parametrize("text, expected", [
    ("DataLoader worker (pid 17) is killed by signal: Killed. ", "out-of-memory killer"),
    ("DataLoader worker (pid 17) is killed by signal: Bus error. It is possible that dataloader's workers are out "
     "of shared memory. Please try to raise your shared memory limit.", "/dev/shm"),
    ("DataLoader worker (pid(s) 17, 18) exited unexpectedly", "exited unexpectedly"),
    # Which of torch's two messages comes is a race: both name the likely cause.
    ("DataLoader worker (pid(s) 17, 18) exited unexpectedly", "out-of-memory killer"),
])
def test_torch_worker_errors_are_recognised(text, expected):
    died = worker_death(RuntimeError(text))
    assert isinstance(died, WorkerDied) and expected in str(died) and died.key == "data.num_workers"
    assert worker_death(RuntimeError("CUDA error: out of memory")) is None


def test_a_death_noticed_outside_a_fetch_waits_for_the_next_fetch():
    guard = WorkerDeathGuard()
    guard.pending = worker_death(RuntimeError("DataLoader worker (pid 17) is killed by signal: Killed. "))
    with pytest.raises(WorkerDied):
        with guard.fetching():
            pass
    with guard.fetching():  # raised once
        pass


def _reported(filename: str, error: BaseException) -> list[str]:
    """The thread errors passed on to the previous hook when a thread whose function lives
    in ``filename`` raises ``error``, with the worker's hook installed."""
    import threading

    from optimus_preflight.training.loaders import quiet_orphaned_fd_sharer

    namespace: dict = {}
    exec(compile("def serve(error):\n    raise error\n", filename, "exec"), namespace)
    reported: list[str] = []
    previous = threading.excepthook
    try:
        threading.excepthook = lambda args: reported.append(f"{args.exc_type.__name__}: {args.exc_value}")
        quiet_orphaned_fd_sharer()
        thread = threading.Thread(target=namespace["serve"], args=(error,))
        thread.start()
        thread.join()
    finally:
        threading.excepthook = previous
    return reported


def test_a_reset_fd_sharer_in_a_worker_is_dropped_and_other_thread_errors_still_show():
    """The main process exited while a worker's resource_sharer thread was handing it a batch."""
    sharer = "/usr/lib/python3/multiprocessing/resource_sharer.py"
    assert _reported(sharer, ConnectionResetError(104, "Connection reset by peer")) == []
    assert _reported(sharer, ValueError("a real bug")) == ["ValueError: a real bug"]
    assert _reported("/app/mine.py", ConnectionResetError(104, "reset")) == ["ConnectionResetError: [Errno 104] reset"]
