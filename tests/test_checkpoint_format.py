"""The checkpoint format (tensor_file.py): state.pt (structure + index) beside tensors.bin.

Every dtype and tensor shape a training state holds round-trips exactly (values, dtype,
shape, strides, storage offsets, shared storages); a tampered index is refused with
CheckpointCorrupt before any tensor is built; checkpoints of the earlier format (one
torch.save state.pt) still load."""

from __future__ import annotations

import collections
import hashlib
import json
import math

import pytest
import torch

from optimus_preflight.checkpoint import tensor_file
from optimus_preflight.checkpoint.store import (
    MANIFEST_FILE,
    STATE_FILE,
    CheckpointCorrupt,
    CheckpointStore,
    load_state,
    verify,
)
from optimus_preflight.checkpoint.tensor_file import TENSORS_FILE


def _every_kind_of_tensor() -> dict:
    torch.manual_seed(0)
    base = torch.randn(4, 6)
    module_state = torch.nn.BatchNorm1d(3).state_dict()  # an OrderedDict with _metadata
    shared = torch.arange(10, dtype=torch.int64)
    return {
        "fp32": torch.randn(3, 5),
        "bf16": torch.randn(7).to(torch.bfloat16),
        "fp16": torch.randn(2, 3).half(),
        "fp64": torch.randn(2, dtype=torch.float64),
        "int64": torch.arange(-3, 9),
        "int32": torch.arange(5, dtype=torch.int32),
        "int8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "uint8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "complex64": torch.randn(3, dtype=torch.complex64),
        "scalar": torch.tensor(2.5),  # 0-dim
        "step": torch.tensor(7.0),  # as Adam keeps its step count
        "empty": torch.empty(0, 4),
        "transposed": base.t(),  # non-contiguous
        "sliced": base[1:, 2:5],  # a view at a storage offset
        "base": base,  # shares its storage with the two views above
        "expanded": torch.randn(3, 1).expand(3, 4),  # stride 0
        "tied": (shared, shared.view(2, 5)),  # tied weights: one storage, two tensors
        "parameter": torch.nn.Parameter(torch.randn(2)),
        "requires_grad": torch.randn(2).requires_grad_(),
        "meta": torch.empty(3, 2, device="meta"),
        "module": module_state,
        "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}}, "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0]}]},
        "plain": {"nan": math.nan, "inf": -math.inf, "none": None, "text": "x", 3: [1, 2.0, True]},
    }


def _assert_same(saved, loaded, where="state"):
    if isinstance(saved, torch.Tensor):
        assert type(loaded) is type(saved), where
        assert (loaded.dtype, loaded.shape, loaded.stride(), loaded.storage_offset(), loaded.requires_grad) == (
            saved.dtype, saved.shape, saved.stride(), saved.storage_offset(), saved.requires_grad), where
        assert loaded.device.type == ("meta" if saved.device.type == "meta" else "cpu"), where
        if saved.device.type != "meta":
            assert torch.equal(loaded.detach(), saved.detach()), where
        return
    assert type(loaded) is type(saved), where
    if isinstance(saved, dict):
        assert list(loaded) == list(saved), where
        assert getattr(loaded, "_metadata", None) == getattr(saved, "_metadata", None), where
        for key in saved:
            _assert_same(saved[key], loaded[key], f"{where}[{key!r}]")
    elif isinstance(saved, (list, tuple)):
        assert len(loaded) == len(saved), where
        for i, (a, b) in enumerate(zip(saved, loaded)):
            _assert_same(a, b, f"{where}[{i}]")
    elif isinstance(saved, float) and math.isnan(saved):
        assert math.isnan(loaded), where
    else:
        assert loaded == saved, where


def test_every_dtype_and_layout_round_trips_exactly(tmp_path):
    state = _every_kind_of_tensor()
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save(state, 1)
    manifest = verify(path)
    assert manifest["format_version"] == 3 and set(manifest["files"]) == {STATE_FILE, TENSORS_FILE}
    loaded = store.load(path)
    _assert_same(state, loaded)
    # Views of one storage stay views of one storage.
    storage = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
    assert storage(loaded["transposed"]) == storage(loaded["sliced"]) == storage(loaded["base"])
    assert storage(loaded["tied"][0]) == storage(loaded["tied"][1])
    assert storage(loaded["base"]) != storage(loaded["fp32"])
    # state.pt alone is a weights_only-loadable torch file: the structure, tensors on the meta device.
    index = torch.load(path / STATE_FILE, weights_only=True)
    assert index["state"]["fp32"].device.type == "meta" and index["state"]["plain"]["text"] == "x"


def test_loaded_tensors_are_private_copies_of_the_file(tmp_path):
    """Memory-mapped copy-on-write: training on a loaded tensor never changes the checkpoint."""
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save({"weights": torch.ones(1000)}, 1)
    store.load(path)["weights"].add_(1)
    verify(path)
    assert torch.equal(store.load(path)["weights"], torch.ones(1000))


def test_a_checkpoint_of_the_earlier_format_still_loads(tmp_path):
    """format_version 2: the whole state in state.pt, written by torch.save."""
    path = tmp_path / "step_00000003"
    path.mkdir()
    state = {"model": {"w": torch.randn(4)}, "run_state": {"step": 3}}
    torch.save(state, path / STATE_FILE)
    data = (path / STATE_FILE).read_bytes()
    manifest = {"format_version": 2, "step": 3, "run_id": "old", "files": {STATE_FILE: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}}
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))
    store = CheckpointStore(tmp_path, run_id="old")
    assert store.latest_valid()[0].path == path
    _assert_same(state, store.load(path))


def test_a_checkpoint_of_a_newer_format_is_refused(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save({"a": torch.ones(2)}, 1)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    (path / MANIFEST_FILE).write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(CheckpointCorrupt, match="format 99, written by a newer"):
        store.load(path)


def test_a_state_without_tensors_or_with_a_sparse_one_is_one_torch_file(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=3)
    plain = store.save({"run_state": {"step": 1}}, 1)
    assert set(verify(plain)["files"]) == {STATE_FILE}
    sparse = torch.eye(3).to_sparse()
    path = store.save({"sparse": sparse, "dense": torch.ones(2)}, 2)
    assert set(verify(path)["files"]) == {STATE_FILE}
    loaded = store.load(path)
    assert torch.equal(loaded["sparse"].to_dense(), torch.eye(3)) and torch.equal(loaded["dense"], torch.ones(2))


def _tamper(path, change) -> None:
    """Rewrite state.pt's index with ``change`` applied and re-sign the manifest, so only
    the loader's own checks stand in the way."""
    index = torch.load(path / STATE_FILE, weights_only=True)
    change(index)
    torch.save(index, path / STATE_FILE)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    for name in [STATE_FILE, *(name for name in manifest["files"] if name.startswith("tensors"))]:
        data = (path / name).read_bytes()
        manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def change(index):
        target = index
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return change


TAMPERED = {
    "storage past the file": (_set("storages", 0, "nbytes", 1 << 40), "lies outside tensors.bin"),
    "storage in a file not named": (_set("storages", 0, "file", 3), "the index names 1"),
    "a file outside the directory": (_set("files", 0, "name", "../../../etc/passwd"), "not tensors.bin or tensors-<n>.bin"),
    "a file named twice": (lambda index: index["files"].append(dict(index["files"][0])), "is named 'tensors.bin'"),
    "negative offset": (_set("storages", 0, "offset", -64), "offset is -64"),
    "view past its storage": (_set("tensors", 0, "shape", [1000]), "reaches past"),
    "shape without strides": (_set("tensors", 0, "shape", [2, 2]), "has shape [2, 2] and stride [1]"),
    "storage offset past its storage": (_set("tensors", 0, "offset", 10**9), "reaches past"),
    "unknown dtype": (_set("tensors", 0, "dtype", "system"), "has dtype 'system'"),
    "dtype as an object": (_set("tensors", 0, "dtype", ["float32"]), "has dtype"),
    "storage that does not exist": (_set("tensors", 0, "storage", 99), "names storage 99"),
    "overlapping storages": (_set("storages", 1, "offset", 0), "overlap"),
    "fewer index entries": (lambda index: index["tensors"].pop(), "more tensors than"),
    "a real tensor as placeholder": (_set("state", "a", torch.zeros(4)), "does not match its index entry"),
    "wrong file size": (_set("files", 0, "bytes", 3), "its index says 3"),
    "other byte order": (_set("byteorder", "big"), "byte order"),
    "other version": (_set(tensor_file.MARKER, 2), "version 2"),
    "shape of strings": (_set("tensors", 0, "shape", ["4"]), "shape is '4'"),
    "bool flags as ints": (_set("tensors", 0, "requires_grad", 1), "flags"),
}


@pytest.mark.parametrize("change, message", TAMPERED.values(), ids=list(TAMPERED))
def test_a_tampered_index_is_refused_before_any_tensor_is_built(tmp_path, change, message):
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save({"a": torch.arange(4.0), "b": torch.ones(3, dtype=torch.int64)}, 1)
    _tamper(path, change)
    verify(path)  # the manifest was re-signed: only the loader's checks remain
    with pytest.raises(CheckpointCorrupt, match="and its tensor files do not form a checkpoint") as caught:
        load_state(path)
    assert message in str(caught.value)


def test_a_pickle_in_the_index_never_runs(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save({"a": torch.arange(4.0)}, 1)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    _tamper(path, _set("state", "a", Exploit()))
    with pytest.raises(CheckpointCorrupt, match="cannot be loaded as plain tensors"):
        load_state(path)
    assert not marker.exists()


def test_a_truncated_tensor_file_fails_verification_and_loading(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save({"a": torch.arange(100.0)}, 1)
    data = (path / TENSORS_FILE).read_bytes()
    (path / TENSORS_FILE).write_bytes(data[:-40])
    with pytest.raises(CheckpointCorrupt, match="truncated"):
        verify(path)
    with pytest.raises(CheckpointCorrupt, match="its index says"):
        load_state(path)


@pytest.mark.parametrize("files", [1, 3])
def test_the_writers_hash_what_they_write(tmp_path, files):
    """SHA-256 of each tensor file is computed on a second thread while writing (and the
    files are written in parallel): each must equal the hash of the bytes on disk,
    across chunk boundaries and padding."""
    big = torch.randn(tensor_file.CHUNK // 4 * 2 + 17)  # spans three chunks
    state = {"small": torch.ones(3), "big": big, "odd": torch.ones(5, dtype=torch.int8), "more": torch.randn(100),
             "last": torch.arange(1000)}
    split = tensor_file.split_state(state, files=files)
    entries = tensor_file.write_tensors(tmp_path, split)
    assert list(entries) == [file["name"] for file in split.index["files"]] and len(entries) == files
    for name, entry in entries.items():
        data = (tmp_path / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert all(storage["offset"] % tensor_file.ALIGN == 0 for storage in split.index["storages"])


def test_a_large_state_is_spread_over_files_written_in_parallel(tmp_path, monkeypatch):
    monkeypatch.setattr(tensor_file, "FILE_BYTES", 64)
    monkeypatch.setattr(tensor_file, "_cores", lambda: 3)
    state = _every_kind_of_tensor()
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save(state, 1)
    assert set(verify(path)["files"]) == {STATE_FILE, "tensors-0.bin", "tensors-1.bin", "tensors-2.bin"}
    _assert_same(state, store.load(path))


def test_map_tensors_keeps_container_types():
    ordered = collections.OrderedDict(a=torch.ones(1))
    ordered._metadata = {"": {"version": 1}}
    out = tensor_file.map_tensors({"o": ordered, "t": (torch.ones(1), [torch.ones(1)])}, lambda t: t + 1)
    assert type(out["o"]) is collections.OrderedDict and out["o"]._metadata == {"": {"version": 1}}
    assert type(out["t"]) is tuple and type(out["t"][1]) is list and out["t"][1][0].item() == 2.0
