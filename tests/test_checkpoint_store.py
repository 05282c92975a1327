"""Atomic checkpoints: kill -9 mid-write, truncation, pruning, safe loading."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from optimus_preflight.checkpoint.store import (
    MANIFEST_FILE,
    POINTER_FILE,
    STATE_FILE,
    CheckpointCorrupt,
    CheckpointStore,
    verify,
)
from optimus_preflight.training import rng


def _state(step: int, size: int = 1000) -> dict:
    return {"step": step, "weights": torch.full((size,), float(step))}


def test_save_verify_load_and_pointer(tmp_path):
    store = CheckpointStore(tmp_path / "checkpoints", keep_last=2)
    for step in (1, 2, 3):
        path = store.save(_state(step), step)
    assert [ref.step for ref in store.candidates()] == [3, 2]  # pruned to keep_last
    assert (store.directory / POINTER_FILE).read_text().strip() == path.name
    manifest = verify(path)
    assert manifest["files"][STATE_FILE]["bytes"] == (path / STATE_FILE).stat().st_size
    assert torch.equal(store.load(path)["weights"], torch.full((1000,), 3.0))
    assert not list(store.directory.glob(".tmp-*"))


def test_saving_the_same_step_twice_keeps_the_first(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=3)
    first = store.save(_state(5), 5)
    mtime = (first / STATE_FILE).stat().st_mtime_ns
    assert store.save(_state(5), 5) == first
    assert (first / STATE_FILE).stat().st_mtime_ns == mtime


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_manifest"])
def test_damaged_newest_checkpoint_is_skipped(tmp_path, damage):
    store = CheckpointStore(tmp_path, keep_last=3)
    store.save(_state(1), 1)
    newest = store.save(_state(2), 2)
    state = newest / STATE_FILE
    if damage == "truncate":
        state.write_bytes(state.read_bytes()[:-10])
    elif damage == "flip":
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
    else:
        (newest / MANIFEST_FILE).unlink()
    with pytest.raises(CheckpointCorrupt):
        verify(newest)
    ref, skipped = store.latest_valid()
    assert ref.step == 1 and skipped[0][0] == newest


def test_loading_never_executes_pickled_code(tmp_path):
    """A checkpoint with a valid manifest but a malicious pickle must not run it."""
    store = CheckpointStore(tmp_path, keep_last=3)
    path = store.save(_state(1), 1)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"model": Exploit()}, path / STATE_FILE)
    # Re-sign the manifest so only the weights_only loader stands in the way.
    import hashlib
    import json

    data = (path / STATE_FILE).read_bytes()
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    manifest["files"][STATE_FILE] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointCorrupt, match="cannot be loaded as plain tensors") as caught:
        store.load(path)
    assert not marker.exists()
    # torch's own advice, to retry with weights_only=False, would run the exploit: never passed on.
    assert "weights_only" not in str(caught.value)


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    import numpy as np

    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = rng.to_checkpoint(rng.capture())
    expected = (random.random(), float(np.random.rand()), torch.rand(3))
    store = CheckpointStore(tmp_path, keep_last=1)
    loaded = store.load(store.save({"rng": state}, 1))["rng"]
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    rng.restore(rng.from_checkpoint(loaded))
    assert random.random() == expected[0]
    assert float(np.random.rand()) == expected[1]
    assert torch.equal(torch.rand(3), expected[2])


WRITER = textwrap.dedent(
    """
    import sys, torch
    from optimus_preflight.checkpoint.store import CheckpointStore
    store = CheckpointStore(__import__("pathlib").Path(sys.argv[1]), keep_last=2)
    weights = torch.randn(4_000_000)  # 16 MB: each save takes long enough to be hit
    step = int(sys.argv[2])
    print("ready", flush=True)
    while True:
        step += 1
        store.save({"weights": weights, "step": step}, step)
    """
)


@pytest.mark.slow
def test_kill_9_during_writes_always_leaves_a_loadable_checkpoint(tmp_path):
    directory = tmp_path / "checkpoints"
    rng = random.Random(0)
    last_step = 0
    for _ in range(8):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(directory), str(last_step)], stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.6))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        ref, skipped = CheckpointStore(directory, keep_last=2).latest_valid()
        if ref is None:  # killed before the very first save completed
            continue
        assert not skipped, skipped
        assert CheckpointStore(directory).load(ref.path)["step"] == ref.step
        last_step = ref.step
    assert last_step > 0


def test_a_checkpoint_from_before_run_state_held_the_losses_restores_them():
    """Earlier checkpoints kept the reported losses and a cut-short eval beside the run
    state, under "progress"; a resume from one must still report and redo them."""
    from torch.utils.data import DataLoader, TensorDataset

    from optimus_preflight.checkpoint.checkpoint_state import Restorable, apply_state, build_state
    from optimus_preflight.training.run_state import RunState
    from optimus_preflight.training.stream import BatchStream

    def parts() -> Restorable:
        model = torch.nn.Linear(2, 2)
        loader = DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2)
        return Restorable(model, torch.optim.SGD(model.parameters(), lr=0.1), None, torch.amp.GradScaler("cpu", enabled=False),
                          RunState(step=7), BatchStream(loader, 1))

    state = build_state(parts(), rng_state=rng.capture(), config={})
    state["run_state"] = {key: state["run_state"][key] for key in ("step", "skipped_steps", "consecutive_skips", "samples_seen")}
    state["progress"] = {"final_loss": 1.25, "final_val_loss": 1.5, "eval_pending": True}
    restored = parts()
    restored.run_state.step = 0
    apply_state(restored, state)
    assert restored.run_state == RunState(step=7, final_loss=1.25, final_val_loss=1.5, eval_pending=True)
