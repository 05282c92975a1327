"""Atomic, self-verifying checkpoints on disk.

Layout under ``<run_dir>/checkpoints``::

    step_00000120/state.pt        torch.save of the training state
    step_00000120/manifest.json   size and SHA-256 of every file, written last
    latest                        name of the newest checkpoint (for people and tools)

A checkpoint is written into a hidden temporary directory beside its final name,
every file is fsynced, then the directory is renamed into place (atomic on POSIX) and
the parent directory fsynced. A crash at any point leaves either the complete new
checkpoint or none, and the previous ones untouched. The manifest catches what
atomicity cannot: a copy or a full disk that truncated a file afterwards.

Every manifest names the run that wrote it (``run_id``, kept across resumes).
Retention keeps the newest ``keep_last`` checkpoints of this run that verify: a
damaged directory or another run's checkpoint never takes a slot and is never
deleted, and a save never reuses a directory it did not write.
"""


from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import torch
from torch.serialization import get_crc32_options, set_crc32_options

from optimus_preflight.errors import StorageError

log = logging.getLogger("optimus_preflight")

STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"
POINTER_FILE = "latest"
PREFIX = "step_"
TMP_PREFIX = ".tmp-"
ASIDE_PREFIX = "set-aside-"
FORMAT_VERSION = 2  # 2: manifests carry run_id


class CheckpointCorrupt(Exception):
    """The checkpoint is incomplete, altered or unloadable; the message says how."""




@dataclass(frozen=True)
class CheckpointRef:
    path: Path
    step: int


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


@contextlib.contextmanager
def _without_zip_crc32() -> Iterator[None]:
    """The manifest's SHA-256 already covers every byte; torch's per-record CRC32 on
    top costs about a fifth of torch.save's time."""
    previous = get_crc32_options()
    set_crc32_options(False)
    try:
        yield
    finally:
        set_crc32_options(previous)


def _fsync_dir(path: Path) -> None:
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


def _step_of(path: Path) -> int | None:
    name = path.name
    if not name.startswith(PREFIX):
        return None
    try:
        return int(name[len(PREFIX) :])
    except ValueError:
        return None


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
        if _sha256_of(file) != expected["sha256"]:
            raise CheckpointCorrupt(f"{file} does not match its SHA-256 in the manifest (altered or damaged)")
    return manifest


def load_state(path: Path, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Load ``state.pt`` with ``weights_only=True`` (no pickled code runs); anything that
    does not load, or lacks a ``required`` key, is CheckpointCorrupt. torch's advice to
    retry with weights_only=False is not passed on: that would execute the file."""
    try:
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # UnpicklingError, RuntimeError (zip), EOFError...: all "cannot load"
        reason = next((line.strip() for line in str(error).splitlines() if "weights_only" not in line and line.strip()),
                      type(error).__name__)
        raise CheckpointCorrupt(f"{path / STATE_FILE} cannot be loaded as plain tensors and containers "
                                f"({type(error).__name__}: {reason[:200]})") from None
    missing = [key for key in required if not isinstance(state, dict) or key not in state]
    if missing:
        raise CheckpointCorrupt(f"{path / STATE_FILE} is not a training checkpoint (no {', '.join(missing)})")
    return state


class CheckpointStore:
    def __init__(self, directory: Path, keep_last: int = 3, run_id: str | None = None):
        self.directory = directory
        self.keep_last = keep_last
        # Whose checkpoints this store writes and prunes; the resumed run's id on resume.
        self.run_id = run_id
        # Directories known to verify (written or verified by this process): retention
        # hashes each older checkpoint at most once.
        self._verified: set[Path] = set()

    def candidates(self) -> list[CheckpointRef]:
        """Checkpoint directories, newest first (valid or not)."""
        if not self.directory.is_dir():
            return []
        refs = [CheckpointRef(p, step) for p in self.directory.iterdir() if (step := _step_of(p)) is not None and p.is_dir()]
        return sorted(refs, key=lambda ref: ref.step, reverse=True)

    def latest_valid(self) -> tuple[CheckpointRef | None, list[tuple[Path, str]]]:
        """The newest checkpoint that verifies, and the newer ones skipped with the reason."""
        skipped: list[tuple[Path, str]] = []
        for ref in self.candidates():
            try:
                self._verify(ref.path)
            except CheckpointCorrupt as error:
                skipped.append((ref.path, str(error)))
                continue
            return ref, skipped
        return None, skipped

    def _verify(self, path: Path) -> dict[str, Any]:
        manifest = verify(path)
        self._verified.add(path)
        return manifest

    def _verified_once(self, path: Path) -> dict[str, Any]:
        """For retention: verify() at most once per directory and process (choosing a
        checkpoint to resume from always verifies it afresh)."""
        return read_manifest(path) if path in self._verified else self._verify(path)

    def last_good(self) -> Path | None:
        ref, _ = self.latest_valid()
        return ref.path if ref else None

    def save(self, state: dict[str, Any], step: int) -> Path:
        """Write ``state`` as ``step_<step>`` atomically, point ``latest`` at it, prune.
        Raises CheckpointWriteError (one message, the partial write removed) when the
        disk refuses it."""
        final = self.directory / f"{PREFIX}{step:08d}"
        if final in self._verified and self._owner(final) == self.run_id:
            return final  # saved already by this run (e.g. periodic, then final)
        tmp = self.directory / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_partial_writes()
            if final.exists():
                self.set_aside([final], "replaced")  # another run's or a damaged one: kept, never reused
            written = self._write(tmp, state, step)
            os.rename(tmp, final)
            _fsync_dir(self.directory)
            _write_text_atomic(self.directory / POINTER_FILE, final.name + "\n")
        except OSError as error:
            shutil.rmtree(tmp, ignore_errors=True)
            last = self.last_good()
            detail = f"The last good checkpoint is {last}." if last else "No checkpoint of this run is on disk yet."
            raise StorageError.from_os_error(error, f"checkpoint {final.name}", self.directory, detail) from None
        self._verified.add(final)
        self._prune()
        log.debug("saved %s (%d bytes)", final, written)
        return final

    def _write(self, tmp: Path, state: dict[str, Any], step: int) -> int:
        tmp.mkdir()
        started = time.perf_counter()
        with open(tmp / STATE_FILE, "wb") as handle, _without_zip_crc32():
            writer = _HashingWriter(handle)
            try:
                torch.save(state, writer)
            except RuntimeError:
                if writer.error is not None:
                    raise writer.error from None
                raise
            handle.flush()
            os.fsync(handle.fileno())
        manifest = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "run_id": self.run_id,
            "created_unix": time.time(),
            "write_s": round(time.perf_counter() - started, 4),
            "torch_version": torch.__version__,
            "files": {STATE_FILE: {"bytes": writer.size, "sha256": writer.digest.hexdigest()}},
        }
        _write_text_atomic(tmp / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
        _fsync_dir(tmp)
        return writer.size

    def load(self, path: Path, required: tuple[str, ...] = ()) -> dict[str, Any]:
        """Verify, then load with ``weights_only=True`` (see ``load_state``).

        Tensors are memory-mapped, so a large checkpoint is not held twice in RAM while
        it is copied into the model and optimizer.
        """
        self._verify(path)
        return load_state(path, required)

    def set_aside(self, paths: list[Path], why: str) -> Path | None:
        """Move checkpoint directories out of the way (never delete them): ``auto`` and
        retention see only ``step_*`` directories."""
        paths = [path for path in paths if path.exists()]
        if not paths:
            return None
        aside = self.directory / f"{ASIDE_PREFIX}{why}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        aside.mkdir(exist_ok=True)
        for path in paths:
            shutil.move(str(path), aside / path.name)
            self._verified.discard(path)
        return aside

    def _owner(self, path: Path) -> str | None:
        try:
            return read_manifest(path).get("run_id")
        except CheckpointCorrupt:
            return None

    def _remove_partial_writes(self) -> None:
        # The run dir is locked by this process (rank 0 of one run), so any temporary
        # directory is the remains of a writer that was killed.
        for leftover in self.directory.glob(f"{TMP_PREFIX}*"):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)

    def _prune(self) -> None:
        """Keep the newest ``keep_last`` verified checkpoints of this run; delete older
        ones of this run. Damaged and foreign directories count for nothing."""
        kept = 0
        for ref in self.candidates():
            if self._owner(ref.path) != self.run_id:
                continue
            try:
                self._verified_once(ref.path)
            except CheckpointCorrupt as error:
                log.warning("not counting damaged checkpoint %s towards checkpoint.keep_last: %s", ref.path, error)
                continue
            kept += 1
            if kept > self.keep_last:
                shutil.rmtree(ref.path, ignore_errors=True)
                self._verified.discard(ref.path)
