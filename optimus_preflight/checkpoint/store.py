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

log = logging.getLogger("optimus_preflight")

STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"
POINTER_FILE = "latest"
PREFIX = "step_"
TMP_PREFIX = ".tmp-"
FORMAT_VERSION = 1


class CheckpointCorrupt(Exception):
    """The checkpoint is incomplete or altered; the message says how."""


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

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.handle.write(data)

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


def verify(path: Path) -> dict[str, Any]:
    """Return the manifest of a complete, unaltered checkpoint; raise CheckpointCorrupt otherwise."""
    manifest_path = path / MANIFEST_FILE
    if not path.is_dir():
        raise CheckpointCorrupt(f"{path} is not a checkpoint directory")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{path} has no {MANIFEST_FILE} (its write never finished)") from None
    except (OSError, ValueError) as error:
        raise CheckpointCorrupt(f"{manifest_path} is unreadable ({error})") from None
    for name, expected in manifest.get("files", {}).items():
        file = path / name
        if not file.is_file():
            raise CheckpointCorrupt(f"{file} is missing")
        size = file.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointCorrupt(f"{file} has {size} bytes, the manifest says {expected['bytes']} (truncated?)")
        if _sha256_of(file) != expected["sha256"]:
            raise CheckpointCorrupt(f"{file} does not match its SHA-256 in the manifest (altered or damaged)")
    return manifest


class CheckpointStore:
    def __init__(self, directory: Path, keep_last: int = 3):
        self.directory = directory
        self.keep_last = keep_last

    def candidates(self) -> list[CheckpointRef]:
        """Checkpoint directories, newest first (valid or not)."""
        if not self.directory.is_dir():
            return []
        refs = [CheckpointRef(p, step) for p in self.directory.iterdir() if (step := _step_of(p)) is not None]
        return sorted(refs, key=lambda ref: ref.step, reverse=True)

    def latest_valid(self) -> tuple[CheckpointRef | None, list[tuple[Path, str]]]:
        """The newest checkpoint that verifies, and the newer ones skipped with the reason."""
        skipped: list[tuple[Path, str]] = []
        for ref in self.candidates():
            try:
                verify(ref.path)
            except CheckpointCorrupt as error:
                skipped.append((ref.path, str(error)))
                continue
            return ref, skipped
        return None, skipped

    def save(self, state: dict[str, Any], step: int) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"{PREFIX}{step:08d}"
        if final.exists():
            try:
                verify(final)
                return final  # same step saved already (e.g. periodic, then final)
            except CheckpointCorrupt:
                shutil.rmtree(final)
        self._remove_partial_writes()
        tmp = self.directory / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
        tmp.mkdir()
        started = time.perf_counter()
        with open(tmp / STATE_FILE, "wb") as handle, _without_zip_crc32():
            writer = _HashingWriter(handle)
            torch.save(state, writer)
            handle.flush()
            os.fsync(handle.fileno())
        manifest = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "created_unix": time.time(),
            "torch_version": torch.__version__,
            "files": {STATE_FILE: {"bytes": writer.size, "sha256": writer.digest.hexdigest()}},
        }
        _write_text_atomic(tmp / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
        _fsync_dir(tmp)
        os.rename(tmp, final)
        _fsync_dir(self.directory)
        _write_text_atomic(self.directory / POINTER_FILE, final.name + "\n")
        self._prune()
        log.debug("saved %s (%d bytes) in %.3f s", final, writer.size, time.perf_counter() - started)
        return final

    def load(self, path: Path) -> dict[str, Any]:
        """Verify, then load with ``weights_only=True``: loading executes no pickled code.

        Tensors are memory-mapped, so a large checkpoint is not held twice in RAM while
        it is copied into the model and optimizer.
        """
        verify(path)
        return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)

    def _remove_partial_writes(self) -> None:
        # Only this process writes here (rank 0 of one run), so any temporary directory
        # is the remains of a writer that was killed.
        for leftover in self.directory.glob(f"{TMP_PREFIX}*"):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)

    def _prune(self) -> None:
        for ref in self.candidates()[self.keep_last :]:
            shutil.rmtree(ref.path, ignore_errors=True)
