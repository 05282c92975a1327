"""Checkpoints of earlier versions (format 2: one torch.save'd state.pt; format 3: raw
tensors.bin beside an index in state.pt) load through the one converter path,
``legacy.convert``, and a run resumed from one ends bit-identical to a run that was never
stopped. The writers of those formats are gone from the package; minimal ones live here."""

from __future__ import annotations

import hashlib
import json
import sys

import pytest
import torch

from optimus_preflight.checkpoint import legacy
from optimus_preflight.checkpoint.dcp_io import map_tensors
from optimus_preflight.checkpoint.store import MANIFEST_FILE, STATE_FILE, CheckpointCorrupt, CheckpointStore, load_state
from tests.conftest import REPO, run_cli

_DTYPE_NAMES = {dtype: name for name, dtype in legacy.DTYPES.items()}


def _manifest(path, version: int, step: int, run_id: str) -> None:
    files = {}
    for file in sorted(path.iterdir()):
        data = file.read_bytes()
        files[file.name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (path / MANIFEST_FILE).write_text(json.dumps({"format_version": version, "step": step, "run_id": run_id, "files": files}))


def write_format_2(path, state, step: int, run_id: str = "old") -> None:
    path.mkdir(parents=True)
    torch.save(state, path / STATE_FILE)
    _manifest(path, 2, step, run_id)


def write_format_3(path, state, step: int, run_id: str = "old") -> None:
    """tensors.bin: each storage's bytes at a multiple of 64; state.pt: the index."""
    path.mkdir(parents=True)
    storages, entries, blobs, ids = [], [], [], {}
    end = 0

    def place(tensor):
        nonlocal end
        storage = tensor.untyped_storage()
        key = storage.data_ptr() if tensor.device.type != "meta" else ("meta", len(storages))
        if key not in ids:
            ids[key] = len(storages)
            if tensor.device.type == "meta":
                storages.append({"file": 0, "offset": 0, "nbytes": 0, "device": "meta"})
            else:
                offset = -(-end // legacy.ALIGN) * legacy.ALIGN
                data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy().tobytes()
                blobs.append((offset, data))
                storages.append({"file": 0, "offset": offset, "nbytes": len(data), "device": "cpu"})
                end = offset + len(data)
        entries.append({"storage": ids[key], "dtype": _DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "stride": list(tensor.stride()), "offset": tensor.storage_offset(),
                        "requires_grad": tensor.requires_grad, "parameter": isinstance(tensor, torch.nn.Parameter)})
        return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")

    skeleton = map_tensors(state, place)
    with open(path / "tensors.bin", "wb") as handle:
        for offset, data in blobs:
            handle.write(bytes(offset - handle.tell()))
            handle.write(data)
    index = {legacy.MARKER: 1, "byteorder": sys.byteorder, "files": [{"name": "tensors.bin", "bytes": end}],
             "storages": storages, "tensors": entries, "state": skeleton}
    torch.save(index, path / STATE_FILE)
    _manifest(path, 3, step, run_id)


WRITERS = {"format-2": write_format_2, "format-3": write_format_3}


def _state() -> dict:
    torch.manual_seed(0)
    base = torch.randn(4, 6)
    return {"model": {"w": base, "w_t": base.t(), "b": torch.randn(3).to(torch.bfloat16)},
            "meta": torch.empty(2, device="meta"), "run_state": {"step": 3}, "text": "x"}


@pytest.mark.parametrize("write", WRITERS.values(), ids=list(WRITERS))
def test_an_old_checkpoint_loads_with_every_tensor_as_saved(tmp_path, write):
    state = _state()
    path = tmp_path / "step_00000003"
    write(path, state, 3)
    store = CheckpointStore(tmp_path, run_id="old")
    assert store.latest_valid()[0].path == path
    loaded = store.load(path)
    assert torch.equal(loaded["model"]["w"], state["model"]["w"]) and torch.equal(loaded["model"]["w_t"], state["model"]["w"].t())
    assert loaded["model"]["b"].dtype == torch.bfloat16 and torch.equal(loaded["model"]["b"], state["model"]["b"])
    assert loaded["meta"].device.type == "meta" and loaded["run_state"] == {"step": 3} and loaded["text"] == "x"


def test_a_format_3_index_is_checked_before_any_tensor_is_built(tmp_path):
    path = tmp_path / "step_00000003"
    write_format_3(path, _state(), 3)
    index = torch.load(path / STATE_FILE, weights_only=True)
    index["storages"][0]["nbytes"] = 1 << 40
    torch.save(index, path / STATE_FILE)
    _manifest(path, 3, 3, "old")
    with pytest.raises(CheckpointCorrupt, match="lies outside tensors.bin"):
        load_state(path)


TINY = ("recipe=char_lm_tiny", "logging.progress=none", "preflight.enabled=false", "trainer.max_steps=4",
        "logging.every_n_steps=1", "checkpoint.keep_last=5")


@pytest.mark.slow
def test_a_run_resumed_from_an_old_checkpoint_ends_bit_identical(tmp_path):
    reference = run_cli(tmp_path / "reference", *TINY, "checkpoint.every_n_steps=2", cwd=REPO)
    assert reference.returncode == 0, reference.output
    saved = CheckpointStore(tmp_path / "reference" / "checkpoints").load(tmp_path / "reference" / "checkpoints" / "step_00000002")
    losses = {record["step"]: record["loss"] for record in reference.metrics() if "loss" in record}
    for name, write in WRITERS.items():
        old = tmp_path / f"old-{name}" / "step_00000002"
        write(old, saved, 2)
        resumed = run_cli(tmp_path / f"resumed-{name}", *TINY, f"checkpoint.resume={old}", cwd=REPO)
        assert resumed.returncode == 0, resumed.output
        assert resumed.summary()["params_sha256"] == reference.summary()["params_sha256"], name
        continued = {record["step"]: record["loss"] for record in resumed.metrics() if "loss" in record}
        assert min(continued) == 3 and all(continued[step] == losses[step] for step in continued), name
        # Its checkpoints are written in today's format.
        assert (tmp_path / f"resumed-{name}" / "checkpoints" / "step_00000004" / ".metadata").is_file()
