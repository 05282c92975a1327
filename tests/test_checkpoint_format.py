"""The checkpoint format (format_version 4): the tensors in DCP's files (dcp_io.py), the
rest in state.pt (structure + the DCP key of each tensor), both covered by the manifest.

Every dtype and tensor shape a training state holds round-trips exactly (values, dtype,
shape); a tampered index, or a pickle in state.pt or in DCP's .metadata, is refused with
CheckpointCorrupt and never runs. Earlier formats load through legacy.convert:
tests/test_checkpoint_legacy.py."""

from __future__ import annotations

import collections
import hashlib
import json
import math
import pickle

import pytest
import torch

from optimus_preflight.checkpoint import dcp_io
from optimus_preflight.checkpoint.store import (
    MANIFEST_FILE,
    STATE_FILE,
    CheckpointCorrupt,
    CheckpointStore,
    load_state,
    verify,
)


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
        "base": base,
        "expanded": torch.randn(3, 1).expand(3, 4),  # stride 0
        "tied": (shared, shared.view(2, 5)),  # tied weights: one storage, two tensors
        "meta": torch.empty(3, 2, device="meta"),
        "module": module_state,
        "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}}, "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0]}]},
        "dotted": {"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}},  # two paths that join to one key
        "plain": {"nan": math.nan, "inf": -math.inf, "none": None, "text": "x", 3: [1, 2.0, True]},
    }


def _assert_same(saved, loaded, where="state"):
    if isinstance(saved, torch.Tensor):
        assert (loaded.dtype, loaded.shape) == (saved.dtype, saved.shape), where
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
    assert manifest["format_version"] == 4
    assert set(manifest["files"]) == {STATE_FILE, ".metadata", "__0_0.distcp"}
    _assert_same(state, store.load(path))
    # state.pt alone is a weights_only-loadable torch file: the structure, tensors on the meta device.
    index = torch.load(path / STATE_FILE, weights_only=True)
    assert dcp_io.is_index(index) and index["state"]["fp32"].device.type == "meta" and index["state"]["plain"]["text"] == "x"
    # The model's keys read as in an FSDP run's shards (optimus-export relies on it).
    assert "module.weight" in index["keys"] and "optimizer.state.0.exp_avg" in index["keys"]


def test_loaded_tensors_are_private_copies(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save({"weights": torch.ones(1000)}, 1)
    store.load(path)["weights"].add_(1)
    verify(path)
    assert torch.equal(store.load(path)["weights"], torch.ones(1000))


def test_a_checkpoint_of_a_newer_format_is_refused(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save({"a": torch.ones(2)}, 1)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    (path / MANIFEST_FILE).write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(CheckpointCorrupt, match="format 99, written by a newer"):
        store.load(path)


def test_a_state_without_tensors_is_one_torch_file_and_a_sparse_tensor_stays_in_it(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=3)
    plain = store.save({"run_state": {"step": 1}}, 1)
    assert set(verify(plain)["files"]) == {STATE_FILE}
    sparse = torch.eye(3).to_sparse()
    path = store.save({"sparse": sparse, "dense": torch.ones(2)}, 2)
    assert set(verify(path)["files"]) == {STATE_FILE, ".metadata", "__0_0.distcp"}
    loaded = store.load(path)
    assert torch.equal(loaded["sparse"].to_dense(), torch.eye(3)) and torch.equal(loaded["dense"], torch.ones(2))


def _resign(path) -> None:
    """Re-sign the manifest, so only the loader's own checks stand in the way."""
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    for name in manifest["files"]:
        data = (path / name).read_bytes()
        manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))


def _tamper(path, change) -> None:
    index = torch.load(path / STATE_FILE, weights_only=True)
    change(index)
    torch.save(index, path / STATE_FILE)
    _resign(path)


def _set_keys(keys):
    return lambda index: index.__setitem__("keys", keys)


TAMPERED = {
    "a key DCP does not hold": (_set_keys(["a", "nowhere"]), "has no tensor 'nowhere'"),
    "fewer keys than tensors": (_set_keys(["a"]), "more tensors than the 1"),
    "more keys than tensors": (_set_keys(["a", "b", "b"]), "more than its state holds"),
    "keys not a list": (_set_keys("a"), "no list of tensor keys"),
    "swapped keys": (_set_keys(["b", "a"]), "does not match DCP's"),
    "other version": (lambda index: index.__setitem__(dcp_io.MARKER, 2), "version 2"),
}


@pytest.mark.parametrize("change, message", TAMPERED.values(), ids=list(TAMPERED))
def test_a_tampered_index_is_refused(tmp_path, change, message):
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save({"a": torch.arange(4.0), "b": torch.ones(3, dtype=torch.int64)}, 1)
    _tamper(path, change)
    verify(path)  # the manifest was re-signed: only the loader's checks remain
    with pytest.raises(CheckpointCorrupt, match="and its tensor files do not form a checkpoint") as caught:
        load_state(path)
    assert message in str(caught.value)


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_pickle_in_state_pt_never_runs(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save({"a": torch.arange(4.0)}, 1)
    marker = tmp_path / "pwned"
    _tamper(path, lambda index: index["state"].__setitem__("a", _Exploit(marker)))
    with pytest.raises(CheckpointCorrupt, match="cannot be loaded as plain tensors"):
        load_state(path)
    assert not marker.exists()


def test_a_pickle_in_dcps_metadata_never_runs(tmp_path):
    """DCP's own reader unpickles .metadata freely; this one allows DCP's classes only."""
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save({"a": torch.arange(4.0)}, 1)
    marker = tmp_path / "pwned"
    (path / ".metadata").write_bytes(pickle.dumps(_Exploit(marker)))
    _resign(path)
    with pytest.raises(CheckpointCorrupt, match="names io.open, which a DCP index never holds"):
        load_state(path)
    assert not marker.exists()


def test_a_dcp_index_naming_a_file_outside_the_checkpoint_is_refused(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save({"a": torch.arange(4.0)}, 1)
    metadata = dcp_io.SafeReader(str(path)).read_metadata()
    for info in metadata.storage_data.values():
        info.relative_path = "../../elsewhere.distcp"
    metadata.storage_meta = None
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    _resign(path)
    with pytest.raises(CheckpointCorrupt, match="names a file outside its directory"):
        load_state(path)


def test_a_truncated_tensor_file_fails_verification_and_loading(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save({"a": torch.arange(100.0)}, 1)
    shard = path / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-40])
    with pytest.raises(CheckpointCorrupt, match="truncated"):
        verify(path)
    with pytest.raises(CheckpointCorrupt):
        store.load(path)


def test_map_tensors_keeps_container_types():
    ordered = collections.OrderedDict(w=torch.zeros(1))
    ordered._metadata = {"": {"version": 1}}
    out = dcp_io.map_tensors({"o": ordered, "t": (torch.ones(1), [torch.ones(1)])}, lambda t: t + 1)
    assert type(out["o"]) is collections.OrderedDict and out["o"]._metadata == {"": {"version": 1}}
    assert type(out["t"]) is tuple and type(out["t"][1]) is list and torch.equal(out["t"][1][0], torch.full((1,), 2.0))


def test_a_damaged_shard_is_corrupt_not_a_crash(tmp_path):
    store = CheckpointStore(tmp_path, keep_last=1)
    path = store.save({"a": torch.arange(100.0)}, 1)
    shard = path / "__0_0.distcp"
    shard.write_bytes(b"\0" * shard.stat().st_size)
    _resign(path)
    with pytest.raises(CheckpointCorrupt, match="do not form a checkpoint"):
        load_state(path)


def test_a_full_disk_during_the_dcp_write_is_an_oserror(tmp_path, monkeypatch):
    """DCP wraps a rank's failure in a BaseException; the store needs the OSError itself."""
    import errno

    from torch.distributed.checkpoint import filesystem

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(filesystem, "_write_item", full)
    with pytest.raises(OSError, match="No space left"):
        dcp_io.save_tensors(tmp_path, {"a": torch.ones(3)})
