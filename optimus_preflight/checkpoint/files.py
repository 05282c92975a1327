"""The files of one checkpoint directory: written (fsynced, hashed as they are written
or right after), verified against ``manifest.json``, and loaded with
``weights_only=True``. ``store.py`` arranges directories of them into a run's
checkpoints (atomic rename, ``latest``, retention); see its docstring for the layout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import torch

from optimus_preflight.checkpoint import dcp_io, legacy

STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"
TMP_PREFIX = ".tmp-"
FORMAT_VERSION = 4  # 4: tensors in DCP's files beside state.pt; 3: raw tensors.bin (legacy.py); 2: manifests carry run_id


class CheckpointCorrupt(Exception):
    """The checkpoint is incomplete, altered or unloadable; the message says how."""




class _HashingWriter:
    """A file wrapper that hashes bytes as torch.save writes them: one pass, not two."""

    def __init__(self, handle: BinaryIO):
        self.handle = handle
        self.digest = hashlib.sha256()
        self.size = 0
        # torch's zip writer reports a failed write as "unexpected pos": keep the real cause.
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.handle.flush()


def _save_hashed(obj: Any, path: Path) -> dict[str, Any]:
    """torch.save ``obj`` to ``path``, fsynced; returns its manifest entry."""
    with open(path, "wb") as handle, dcp_io.without_zip_crc32():
        writer = _HashingWriter(handle)
        try:
            torch.save(obj, writer)
        except RuntimeError:
            if writer.error is not None:
                raise writer.error from None
            raise
        handle.flush()
        os.fsync(handle.fileno())
    return {"bytes": writer.size, "sha256": writer.digest.hexdigest()}


def write_state(directory: Path, state: Any) -> dict[str, dict[str, Any]]:
    """Write ``state`` into ``directory``: its tensors with DCP (dcp_io.py) and the rest,
    with the index of the tensors, as ``state.pt``; a state without tensors, or one whose
    tensors are in DCP files there already, as ``state.pt`` alone.
    Every file fsynced. Returns the manifest entries of the files written."""
    if dcp_io.is_index(state) or (directory / dcp_io.METADATA_FILE).exists():
        # Beside DCP files written already (a background save's, FSDP's shards), the rest.
        return {STATE_FILE: _save_hashed(state, directory / STATE_FILE)}
    index, tensors = dcp_io.split_state(state)
    if not tensors:
        return {STATE_FILE: _save_hashed(state, directory / STATE_FILE)}
    dcp_io.save_tensors(directory, tensors)
    fsync_dir(directory)
    return {STATE_FILE: _save_hashed(index, directory / STATE_FILE), **hash_files(directory, _dcp_files(directory))}


def _dcp_files(directory: Path) -> list[str]:
    return sorted(file.name for file in directory.iterdir()
                  if file.is_file() and (file.name == dcp_io.METADATA_FILE or file.suffix == ".distcp"))


def hash_files(directory: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Manifest entries of files already written (and fsynced by their writer); large
    ones hashed in parallel (hashlib and reads release the GIL)."""
    sizes = {name: (directory / name).stat().st_size for name in names}
    large = [name for name in names if sizes[name] >= 1 << 20]
    workers = min(len(large), os.cpu_count() or 1, 8)
    if workers > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="checkpoint-sha256") as pool:
            digests = dict(zip(large, pool.map(lambda name: _sha256_of(directory / name), large)))
    else:
        digests = {}
    return {name: {"bytes": sizes[name], "sha256": digests[name] if name in digests else _sha256_of(directory / name)}
            for name in names}


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _check_manifest(manifest: Any, path: Path) -> dict[str, Any]:
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        raise CheckpointCorrupt(f"{path / MANIFEST_FILE} is malformed (no 'files' table)")
    for name, entry in files.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("bytes"), int) and isinstance(entry.get("sha256"), str)):
            raise CheckpointCorrupt(f"{path / MANIFEST_FILE} is malformed (entry {name!r} lacks bytes/sha256)")
        if Path(name).name != name:
            raise CheckpointCorrupt(f"{path / MANIFEST_FILE} names a file outside its directory: {name!r}")
    return manifest


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a checkpoint directory, checked for shape (not for content)."""
    if not path.is_dir():
        raise CheckpointCorrupt(f"{path} is not a checkpoint directory")
    manifest_path = path / MANIFEST_FILE
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{path} has no {MANIFEST_FILE} (its write never finished)") from None
    except (OSError, ValueError) as error:
        raise CheckpointCorrupt(f"{manifest_path} is unreadable ({error})") from None
    return _check_manifest(manifest, path)


def verify(path: Path) -> dict[str, Any]:
    """Return the manifest of a complete, unaltered checkpoint; raise CheckpointCorrupt otherwise."""
    manifest = read_manifest(path)
    for name, expected in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise CheckpointCorrupt(f"{file} is missing")
        size = file.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointCorrupt(f"{file} has {size} bytes, the manifest says {expected['bytes']} (truncated?)")
    digests = hash_files(path, list(manifest["files"]))
    for name, entry in digests.items():
        if entry["sha256"] != manifest["files"][name]["sha256"]:
            raise CheckpointCorrupt(f"{path / name} does not match its SHA-256 in the manifest (altered or damaged)")
    return manifest


def load_state(path: Path, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Load ``state.pt`` with ``weights_only=True`` (no pickled code runs) and the tensors
    its index names (DCP's files through dcp_io's allow-listed reader; an earlier
    format's through ``legacy.convert``);
    anything that does not load, or lacks a ``required`` key, is CheckpointCorrupt.
    torch's advice to retry with weights_only=False is not passed on: that would
    execute the file. A manifest of a newer format than this version writes is refused."""
    version = None
    with contextlib.suppress(CheckpointCorrupt):  # a bare state.pt loads without one
        version = read_manifest(path).get("format_version")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise CheckpointCorrupt(f"{path} is of checkpoint format {version}, written by a newer optimus_preflight; "
                                f"this one reads formats up to {FORMAT_VERSION}")
    try:
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # UnpicklingError, RuntimeError (zip), EOFError...: all "cannot load"
        reason = next((line.strip() for line in str(error).splitlines() if "weights_only" not in line and line.strip()),
                      type(error).__name__)
        raise CheckpointCorrupt(f"{path / STATE_FILE} cannot be loaded as plain tensors and containers "
                                f"({type(error).__name__}: {reason[:200]})") from None
    try:
        state = dcp_io.join_state(path, state) if dcp_io.is_index(state) else legacy.convert(path, state)
    except Exception as error:  # an index that lies, a shard torch cannot read: "cannot load"
        detail = str(error) if isinstance(error, (dcp_io.DcpFormatError, legacy.TensorFileError)) else (
            f"{type(error).__name__}: {str(error).strip().splitlines()[-1][:200] if str(error).strip() else ''}")
        raise CheckpointCorrupt(f"{path / STATE_FILE} and its tensor files do not form a checkpoint ({detail})") from None
    # A sharded checkpoint's model and optimizer are the DCP shards beside state.pt.
    in_shards = ("model", "optimizer") if isinstance(state, dict) and "sharded" in state else ()
    missing = [key for key in required if not isinstance(state, dict) or (key not in state and key not in in_shards)]
    if missing:
        raise CheckpointCorrupt(f"{path / STATE_FILE} is not a training checkpoint (no {', '.join(missing)})")
    return state
