"""checkpoint.async_save=true: periodic checkpoints copied on the training thread and
written in the background, one at a time, with the guarantees of a synchronous save.

Unit tests drive RunCheckpointer directly with a writer held back by an Event; the slow
ones go through the CLI with ``SlowWriteRecipe`` (below), whose background writes pause
between writing the files and the manifest (WRITE_DELAY_S) or fail with ENOSPC
(FAIL_WRITE_AT_STEP)."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.checkpoint import store as store_module
from optimus_preflight.checkpoint.async_writer import BackgroundWriter
from optimus_preflight.checkpoint.checkpoint_state import Restorable
from optimus_preflight.checkpoint.checkpointer import RunCheckpointer
from optimus_preflight.checkpoint.store import CheckpointStore, verify
from optimus_preflight.errors import StorageError
from optimus_preflight.training.distributed import DistEnv
from optimus_preflight.training.run_state import RunState
from optimus_preflight.training.stream import BatchStream
from tests.conftest import REPO, run_cli
from tests.signal_recipe import SelfSignalRecipe


def _in_background() -> bool:
    return threading.current_thread().name.startswith("checkpoint-step-")


class SlowWriteRecipe(SelfSignalRecipe):
    """Background checkpoint writes pause WRITE_DELAY_S seconds once their files are
    written (before the manifest and the rename; only at SLOW_WRITE_AT_STEP if set), and
    the one of FAIL_WRITE_AT_STEP fails as a full disk does."""

    def setup_interruption(self, **objects):
        write_state = store_module.write_state
        delay = float(os.environ.get("WRITE_DELAY_S", "0"))
        fail_at = int(os.environ.get("FAIL_WRITE_AT_STEP", "0"))
        slow_at = int(os.environ.get("SLOW_WRITE_AT_STEP", "0"))

        def slow_write_state(directory, state):
            step = state["run_state"]["step"]
            if _in_background() and step == fail_at:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            files = write_state(directory, state)
            if _in_background() and slow_at in (0, step):
                time.sleep(delay)
            return files

        store_module.write_state = slow_write_state
        return super().setup_interruption(**objects)


# ------------------------------------------------------------------ unit tests
def _parts() -> Restorable:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    loader = DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2)
    return Restorable(model, optimizer, None, torch.amp.GradScaler("cpu", enabled=False), RunState(), BatchStream(loader, 1))


@pytest.fixture
def held_writes(monkeypatch):
    """Background writes wait for ``release`` (an Event) before they write anything."""
    release = threading.Event()
    write_state = store_module.write_state

    def held(directory, state):
        if _in_background():
            assert release.wait(30)
        return write_state(directory, state)

    monkeypatch.setattr(store_module, "write_state", held)
    return release


@pytest.fixture
def checkpointer(tmp_path):
    made = RunCheckpointer(tmp_path, every_n_steps=2, keep_last=2, dist=DistEnv(), config={}, async_save=True)
    made.start(_parts())
    yield made
    made.close()


def _step_to(checkpointer: RunCheckpointer, step: int) -> None:
    checkpointer.parts.run_state.step = step
    checkpointer.mark_boundary()


def test_a_background_save_writes_the_weights_of_its_step_not_later_ones(checkpointer, held_writes):
    _step_to(checkpointer, 2)
    weight = checkpointer.parts.model.weight
    expected = weight.detach().clone()
    assert checkpointer.due(2)
    path = checkpointer.save()
    assert not path.exists() and checkpointer.last_checkpoint() is None  # in flight, not named yet
    with torch.no_grad():
        weight.add_(1.0)  # the next optimizer step, while the write has not even started
    held_writes.set()
    assert checkpointer.finish_background() == path
    state = checkpointer.store.load(path)
    assert torch.equal(state["model"]["weight"], expected)
    assert state["run_state"]["step"] == 2 and checkpointer.last_checkpoint() == path


def test_one_write_in_flight_and_the_final_save_waits_for_it(checkpointer, held_writes):
    _step_to(checkpointer, 2)
    checkpointer.due(2)
    first = checkpointer.save()
    _step_to(checkpointer, 4)
    checkpointer.due(4)
    threading.Timer(0.3, held_writes.set).start()
    started = time.monotonic()
    second = checkpointer.save()  # waits for the first before copying the second
    assert time.monotonic() - started >= 0.25
    verify(first)
    with pytest.raises(RuntimeError, match="already in flight"):
        checkpointer.background.submit({}, 5, started=0.0, waited_s=0.0)
    assert checkpointer.save() == second  # the final save at a periodic step: waits, then it is on disk
    verify(second)
    assert (checkpointer.store.directory / "latest").read_text().strip() == second.name
    _step_to(checkpointer, 5)
    final = checkpointer.save()  # not periodic: written synchronously
    verify(final)
    assert [ref.step for ref in checkpointer.store.candidates()] == [5, 4]  # keep_last=2


def test_a_failed_background_write_stops_the_run_at_the_next_step_boundary(checkpointer, monkeypatch):
    _step_to(checkpointer, 2)
    checkpointer.due(2)
    good = checkpointer.save()
    checkpointer.finish_background()

    def full_disk(directory, state):
        (directory / "state.pt").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store_module, "write_state", full_disk)
    _step_to(checkpointer, 4)
    checkpointer.due(4)
    checkpointer.save()
    while not checkpointer.background.in_flight.done.is_set():
        time.sleep(0.01)
    with pytest.raises(StorageError) as caught:
        _step_to(checkpointer, 5)
    assert caught.value.exit_code == 2
    message = str(caught.value)
    assert "No space left on device" in message and "background write" in message and "checkpoint.resume=auto" in message
    assert checkpointer.background.in_flight is None  # reported once
    verify(good)
    assert checkpointer.store.last_good() == good and checkpointer.last_checkpoint() == good
    assert not list(checkpointer.store.directory.glob(".tmp-*"))  # the partial write is gone


def test_the_host_copy_is_reused_and_keeps_shared_storages(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=3)
    writer = BackgroundWriter(store)
    weights = torch.arange(8.0)
    state = {"w": weights, "view": weights[2:6], "n": 1}
    writer.submit(state, 1, started=time.perf_counter(), waited_s=0.0)
    first = writer.wait()
    buffers = [buffer.data_ptr() for buffer in writer.snapshot._buffers]
    weights.mul_(2)
    writer.submit(state, 2, started=time.perf_counter(), waited_s=0.0)
    second = writer.wait()
    assert [buffer.data_ptr() for buffer in writer.snapshot._buffers] == buffers == buffers[:1]
    assert torch.equal(store.load(first.path)["w"], torch.arange(8.0))
    loaded = store.load(second.path)
    assert torch.equal(loaded["view"], torch.arange(8.0)[2:6] * 2)
    assert loaded["view"].untyped_storage().data_ptr() == loaded["w"].untyped_storage().data_ptr()


# --------------------------------------------------------------- through the CLI
ASYNC = ("recipe=char_lm_tiny", "logging.progress=none", "recipe._target_=tests.test_checkpoint_async.SlowWriteRecipe",
         "trainer.max_steps=8", "checkpoint.every_n_steps=4", "checkpoint.async_save=true", "preflight.enabled=false")


def _checkpoints(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    result = run_cli(tmp_path_factory.mktemp("async") / "run", *ASYNC, cwd=REPO)
    assert result.returncode == 0, result.output
    assert "written in the background" in result.output and "training blocked" in result.output
    return result


@pytest.mark.slow
def test_sigterm_during_a_background_write_waits_for_it_and_resumes_bit_exactly(tmp_path, reference):
    """SIGTERM in step 5 while step 4's checkpoint is still being written: the stop
    waits for that write, saves its own checkpoint and exits 143; the resume ends
    bit-identical to an uninterrupted run."""
    run_dir = tmp_path / "run"
    env = {"SIGNAL_NAME": "SIGTERM", "SIGNAL_PHASE": "train", "SIGNAL_AT": "5", "WRITE_DELAY_S": "1.5"}
    # SelfSignalRecipe counts the training steps after the preflight: it runs here.
    stopped = run_cli(run_dir, *ASYNC, "preflight.enabled=true", cwd=REPO, env=env)
    assert stopped.returncode == 143, stopped.output
    assert "Traceback" not in stopped.output
    waited = stopped.output.index("waiting for checkpoint step_00000004 to be written in the background")
    assert waited < stopped.output.index("checkpoints/step_00000004 (written in the background") < stopped.output.index("stopped by SIGTERM")
    saved = _checkpoints(run_dir)
    assert saved[0] == "step_00000004" and len(saved) in (1, 2), saved
    for name in saved:
        verify(run_dir / "checkpoints" / name)
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
    resumed = run_cli(run_dir, *ASYNC, cwd=REPO)
    assert resumed.returncode == 0, resumed.output
    assert resumed.summary()["resumed_from"].endswith(saved[-1])
    assert resumed.summary()["params_sha256"] == reference.summary()["params_sha256"]


@pytest.mark.slow
def test_kill_9_mid_background_write_leaves_the_previous_checkpoint_to_resume_from(tmp_path, reference):
    """kill -9 while step 8's checkpoint sits written but not yet renamed into place:
    step 4's stays the newest valid one, and the run resumes from it bit-exactly."""
    run_dir = tmp_path / "run"
    env = {"PID_DIR": str(tmp_path), "SLOW_WRITE_AT_STEP": "8", "WRITE_DELAY_S": "120"}
    killed: list = []
    runner = threading.Thread(target=lambda: killed.append(run_cli(run_dir, *ASYNC, cwd=REPO, env=env)))
    runner.start()
    try:
        deadline = time.monotonic() + 120
        while not list((run_dir / "checkpoints").glob(".tmp-step_00000008-*/state.pt")):
            assert runner.is_alive() and time.monotonic() < deadline, killed and killed[0].output
            time.sleep(0.05)
        assert (run_dir / "checkpoints" / "step_00000004").is_dir()
    finally:
        if (tmp_path / "rank0.pid").exists():  # written by SelfSignalRecipe in step 3
            os.kill(int((tmp_path / "rank0.pid").read_text()), signal.SIGKILL)
        runner.join(60)
    assert killed[0].returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), killed[0].output
    ref, skipped = CheckpointStore(run_dir / "checkpoints").latest_valid()
    assert ref.path.name == "step_00000004" and not skipped
    assert _checkpoints(run_dir) == ["step_00000004"]
    resumed = run_cli(run_dir, *ASYNC, cwd=REPO)
    assert resumed.returncode == 0, resumed.output
    assert resumed.summary()["resumed_from"].endswith("step_00000004")
    assert resumed.summary()["params_sha256"] == reference.summary()["params_sha256"]
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))  # the killed write's remains are cleared


@pytest.mark.slow
def test_a_failed_background_write_fails_the_run_with_exit_2(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(run_dir, *ASYNC, "trainer.max_steps=12", cwd=REPO, env={"FAIL_WRITE_AT_STEP": "8"})
    assert result.returncode == 2, result.output
    assert "Traceback" not in result.output
    assert "No space left on device" in result.output and "background write of a checkpoint" in result.output
    assert "checkpoint.resume=auto" in result.output
    assert result.summary()["status"] == "failed"
    assert _checkpoints(run_dir) == ["step_00000004"]
    verify(run_dir / "checkpoints" / "step_00000004")
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
    assert 8 <= max(record["step"] for record in result.metrics()) < 12  # stopped at a step boundary after the failure
