"""OOMObserver: the snapshot summary, the hints, the files it writes, and a real CUDA OOM."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn
from torch.cuda import _memory_viz

from optimus_preflight.memory.oom import OOMObserver, category_by_address, oom_hints, summarize_snapshot

MIB = 1 << 20
USER = {"filename": "/home/user/project/train.py", "line": 42, "name": "main"}


def frame(filename: str, name: str, line: int = 1) -> dict:
    return {"filename": filename, "line": line, "name": name}


def block(address: int, size: int, frames: list, state: str = "active_allocated") -> dict:
    return {"address": address, "size": size, "requested_size": size, "state": state, "frames": frames}


def synthetic_snapshot() -> dict:
    """Shaped like torch.cuda.memory._snapshot() (see its docstring in torch/cuda/memory.py)."""
    base = 0x7F0000000000
    blocks = [
        block(base, 64 * MIB, [frame("/site-packages/torch/nn/modules/module.py", "_apply"), USER]),  # a weight
        block(base + 64 * MIB, 128 * MIB, [frame("/site-packages/torch/optim/adamw.py", "_init_group"), USER]),
        block(base + 192 * MIB, 256 * MIB, [frame("/home/user/project/model.py", "forward", 17), USER]),
        block(
            base + 448 * MIB, 32 * MIB, [frame("/site-packages/torch/autograd/graph.py", "_engine_run_backward"), USER]
        ),
        block(base + 480 * MIB, 32 * MIB, [], state="inactive"),
    ]
    segment = {
        "device": 0,
        "address": base,
        "total_size": 512 * MIB,
        "allocated_size": 480 * MIB,
        "active_size": 480 * MIB,
        "requested_size": 480 * MIB,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }
    traces = [
        {"action": "alloc", "addr": base, "size": 64 * MIB, "stream": 0, "frames": [USER], "time_us": 1},
        {
            "action": "oom",
            "addr": 0,
            "size": 1024 * MIB,
            "stream": 0,
            "frames": [USER],
            "device_free": 3 * MIB,
            "time_us": 2,
        },
    ]
    return {"segments": [segment], "device_traces": [traces], "allocator_settings": {}}


def test_summary_totals_categories_largest_blocks_and_the_failed_request():
    snapshot = synthetic_snapshot()
    summary = summarize_snapshot(snapshot, categories={0x7F0000000000: "params"})
    assert summary.reserved_bytes == 512 * MIB and summary.allocated_bytes == 480 * MIB
    assert summary.by_category == {
        "params": 64 * MIB,  # matched by address
        "optimizer_state": 128 * MIB,  # frames inside torch/optim
        "activations": 256 * MIB,  # allocated in a forward
        "backward_temporaries": 32 * MIB,
    }
    assert [b["size"] for b in summary.largest] == [256 * MIB, 128 * MIB, 64 * MIB, 32 * MIB]
    assert summary.largest[0]["where"] == "model.py:17:forward"
    assert summary.oom_request_bytes == 1024 * MIB and summary.device_free_bytes == 3 * MIB
    text = summary.format()
    assert "activations" in text and "failed request: 1.00 GiB" in text


def test_hints_follow_the_composition_at_the_oom():
    summary = summarize_snapshot(synthetic_snapshot())
    hints = oom_hints(summary, precision="fp32", batch_size=32, largest_batch=12, accumulation_steps=1)
    assert any("data.batch_size=12" in h and "trainer.accumulation_steps=3" in h for h in hints)
    assert any("bf16" in h for h in hints)
    assert any("activation checkpointing" in h for h in hints)
    assert not any("bf16" in h for h in oom_hints(summary, precision="bf16"))


def test_addresses_of_live_parameters_gradients_and_optimizer_state():
    model = nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    addresses = category_by_address(model, optimizer)
    assert addresses[model.weight.untyped_storage().data_ptr()] == "params"
    assert addresses[model.weight.grad.untyped_storage().data_ptr()] == "grads"
    assert addresses[optimizer.state[model.weight]["exp_avg"].untyped_storage().data_ptr()] == "optimizer_state"


def test_observer_writes_a_loadable_snapshot_and_a_summary_once(tmp_path, caplog):
    snapshot = synthetic_snapshot()
    observer = OOMObserver(tmp_path / "oom", snapshot_fn=lambda: snapshot, hint_kwargs={"precision": "fp32"})
    observer.on_oom(0, 1024 * MIB, 480 * MIB, 3 * MIB)
    assert observer.written == []  # not started: observes nothing
    observer.enabled = True
    observer.on_oom(0, 1024 * MIB, 480 * MIB, 3 * MIB)
    pickle_path, summary_path = observer.written
    assert pickle_path.name == "rank0_snapshot.pickle" and summary_path.name == "rank0_summary.txt"
    loaded = pickle.loads(pickle_path.read_bytes())
    assert loaded == snapshot
    assert "segments: 1" in _memory_viz.segsum(loaded)  # what pytorch.org/memory_viz parses
    text = summary_path.read_text()
    assert "largest live allocations" in text and "hint: Set trainer.precision=bf16" in text
    assert "CUDA out of memory" in caplog.text and "memory_viz" in caplog.text
    pickle_path.unlink()
    observer.on_oom(0, 1024 * MIB, 480 * MIB, 3 * MIB)  # the allocator may call again for one OOM
    assert not pickle_path.exists()


def test_a_failing_snapshot_never_masks_the_oom(tmp_path, caplog):
    def broken():
        raise RuntimeError("no history")

    observer = OOMObserver(tmp_path, snapshot_fn=broken)
    observer.enabled = True
    observer.on_oom(0, MIB, 0, 0)
    assert "could not write the OOM report" in caplog.text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_start_is_a_no_op_without_cuda(tmp_path):
    observer = OOMObserver(tmp_path)
    assert observer.start() is False and not observer.enabled
    observer.stop()


@pytest.mark.gpu
def test_a_real_cuda_oom_leaves_a_snapshot_and_a_summary(tmp_path):
    model = nn.Linear(1024, 1024).cuda()
    observer = OOMObserver(tmp_path / "oom", model=model, hint_kwargs={"precision": "fp32"})
    assert observer.start()
    try:
        free, _ = torch.cuda.mem_get_info()
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(int(free * 2), dtype=torch.uint8, device="cuda")
    finally:
        observer.stop()
    pickle_path, summary_path = observer.written
    snapshot = pickle.loads(pickle_path.read_bytes())
    assert snapshot["segments"] and "params" in summary_path.read_text()


def test_the_observer_follows_preflight_oom_observer(tmp_path):
    from optimus_preflight.memory.oom import start_oom_observer
    from tests.conftest import tiny_config

    assert start_oom_observer(tiny_config("preflight.oom_observer=false"), tmp_path) is None
    observer = start_oom_observer(tiny_config("preflight.oom_observer=true"), tmp_path, largest_batch=4)
    if torch.cuda.is_available():
        assert observer.enabled and observer.hint_kwargs["largest_batch"] == 4
        observer.stop()
    else:
        assert observer is None
