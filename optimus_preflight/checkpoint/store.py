"""Atomic, self-verifying checkpoints on disk.

Layout under ``<run_dir>/checkpoints``::

    step_00000120/__0_0.distcp    the tensors, written by torch.distributed.checkpoint
    step_00000120/.metadata       DCP's index of them (dcp_io.py; under FSDP: one
                                  ``__<rank>_0.distcp`` per rank, sharded.py)
    step_00000120/state.pt        torch.save of the rest: the structure, numbers, strings,
                                  and which DCP key each tensor is (weights_only-loadable)
    step_00000120/manifest.json   size and SHA-256 of every file, written last
    latest                        name of the newest checkpoint (for people and tools)

Checkpoints of ``format_version`` 3 (raw ``tensors.bin``) and 2 and earlier (one
``state.pt``) still load, through ``legacy.convert``; a state without tensors is written
as one ``state.pt``.

A checkpoint is written into a hidden temporary directory beside its final name,
every file is fsynced, then the directory is renamed into place (atomic on POSIX) and
the parent directory fsynced. A crash at any point leaves either the complete new
checkpoint or none, and the previous ones untouched. The manifest catches what
atomicity cannot: a copy or a full disk that truncated a file afterwards.

Every manifest names the run that wrote it (``run_id``, kept across resumes).
Retention keeps the newest ``keep_last`` checkpoints of this run that verify: a
damaged directory or another run's checkpoint never takes a slot and is never
deleted, and a save never reuses a directory it did not write. Large checkpoints it
drops are renamed out of sight at once and deleted on a thread (see ``_delete``).

Why this module is long (~350 lines): writing, retention, the best link and setting
aside are one directory's life cycle; the per-file work is in files.py.
"""


from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from optimus_preflight.checkpoint.files import (  # noqa: F401 - names other modules import from here
    FORMAT_VERSION,
    MANIFEST_FILE,
    STATE_FILE,
    TMP_PREFIX,
    CheckpointCorrupt,
    _save_hashed,
    _sha256_of,
    _write_text_atomic,
    fsync_dir,
    hash_files,
    load_state,
    read_manifest,
    verify,
    write_state,
)
from optimus_preflight.errors import StorageError

log = logging.getLogger("optimus_preflight")

POINTER_FILE = "latest"
PREFIX = "step_"
BEST_NAME = "best"  # checkpoint.monitor's best checkpoint, beside the step directories
ASIDE_PREFIX = "set-aside-"


# Retention deletes checkpoints of at least this many bytes on a thread (CheckpointStore._delete).
DELETE_LATER_BYTES = 64 << 20
_deletions: set[threading.Thread] = set()


@atexit.register
def _finish_deletions() -> None:
    for thread in list(_deletions):
        thread.join()


@dataclass(frozen=True)
class CheckpointRef:
    path: Path
    step: int


def _step_of(path: Path) -> int | None:
    name = path.name
    if not name.startswith(PREFIX):
        return None
    try:
        return int(name[len(PREFIX) :])
    except ValueError:
        return None


class CheckpointStore:
    def __init__(self, directory: Path, keep_last: int = 3, run_id: str | None = None):
        self.directory = directory
        self.keep_last = keep_last
        # Whose checkpoints this store writes and prunes; the resumed run's id on resume.
        self.run_id = run_id
        # Directories known to verify (written or verified by this process): retention
        # hashes each older checkpoint at most once.
        self._verified: set[Path] = set()
        # Retention's deletions, running on a thread of their own (see _prune).
        self._deleting: threading.Thread | None = None

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

    def _final(self, step: int) -> Path:
        return self.directory / f"{PREFIX}{step:08d}"

    def saved_already(self, step: int) -> bool:
        """Saved by this run (e.g. periodic, then final): a second save is a no-op."""
        final = self._final(step)
        return final in self._verified and self._owner(final) == self.run_id

    def prepare(self, step: int) -> Path:
        """The empty temporary directory ``step_<step>`` is written into: for files other
        writers put there before ``save`` (the shards of every rank under FSDP)."""
        tmp = self.directory / f"{TMP_PREFIX}{self._final(step).name}-{os.getpid()}"
        self.wait_for_deletions()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_partial_writes()
            tmp.mkdir()
        except OSError as error:
            raise self._storage_error(error, tmp, step) from None
        return tmp

    def discard(self, tmp: Path) -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    def _storage_error(self, error: OSError, tmp: Path, step: int) -> StorageError:
        shutil.rmtree(tmp, ignore_errors=True)
        last = self.last_good()
        detail = f"The last good checkpoint is {last}." if last else "No checkpoint of this run is on disk yet."
        return StorageError.from_os_error(error, f"checkpoint {self._final(step).name}", self.directory, detail)

    def save(self, state: dict[str, Any], step: int, *, prepared: Path | None = None) -> Path:
        """Write ``state`` as ``step_<step>`` atomically, point ``latest`` at it, prune.
        ``prepared``: the directory from ``prepare``, whose files (written by others)
        join the checkpoint and its manifest. Raises StorageError (one message, the
        partial write removed) when the disk refuses it."""
        final = self._final(step)
        if self.saved_already(step):
            if prepared is not None:
                self.discard(prepared)
            return final
        tmp = prepared or self.directory / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
        self.wait_for_deletions()
        try:
            if prepared is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._remove_partial_writes()
            if final.exists():
                self.set_aside([final], "replaced")  # another run's or a damaged one: kept, never reused
            written = self._write(tmp, state, step)
            os.rename(tmp, final)
            fsync_dir(self.directory)
            _write_text_atomic(self.directory / POINTER_FILE, final.name + "\n")
        except OSError as error:
            raise self._storage_error(error, tmp, step) from None
        self._verified.add(final)
        self._prune()
        log.debug("saved %s (%d bytes)", final, written)
        return final

    def _write(self, tmp: Path, state: dict[str, Any], step: int) -> int:
        tmp.mkdir(exist_ok=True)
        # Files others wrote into a prepared directory (fsynced by their writers): the
        # shards of every rank under FSDP, a background save's DCP files.
        others = hash_files(tmp, sorted(file.name for file in tmp.iterdir()
                                        if file.is_file() and file.name not in (STATE_FILE, MANIFEST_FILE)))
        started = time.perf_counter()
        files = write_state(tmp, state)
        manifest = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "run_id": self.run_id,
            "created_unix": time.time(),
            "write_s": round(time.perf_counter() - started, 4),
            "torch_version": torch.__version__,
            "files": {**files, **others},
        }
        _write_text_atomic(tmp / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
        fsync_dir(tmp)
        return sum(entry["bytes"] for entry in manifest["files"].values())

    def keep_as_best(self, path: Path) -> Path:
        """Make ``checkpoints/best`` a copy of the checkpoint at ``path``: hard links (the
        files are never written again), swapped in atomically; retention never prunes
        it (its name is not a step's) and ``resume=auto`` never picks it."""
        best = self.directory / BEST_NAME
        tmp = self.directory / f".{BEST_NAME}.tmp"
        old = self.directory / f".{BEST_NAME}.old"
        try:
            for leftover in (tmp, old):
                if leftover.exists():
                    shutil.rmtree(leftover)
            tmp.mkdir()
            for source in sorted(path.rglob("*")):
                target = tmp / source.relative_to(path)
                if source.is_dir():
                    target.mkdir(exist_ok=True)
                    continue
                try:
                    os.link(source, target)
                except OSError:  # a filesystem without hard links
                    shutil.copy2(source, target)
            fsync_dir(tmp)
            if best.exists():
                os.replace(best, old)
            os.replace(tmp, best)
            fsync_dir(self.directory)
            if old.exists():
                shutil.rmtree(old)
        except OSError as error:
            raise StorageError.from_os_error(error, BEST_NAME, self.directory) from None
        return best

    def load(self, path: Path, required: tuple[str, ...] = ()) -> dict[str, Any]:
        """Verify, then load with ``weights_only=True`` (see ``load_state``).

        Tensors are read into fresh CPU tensors (format 3's are memory-mapped).
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

    def wait_for_deletions(self) -> None:
        """Wait until the checkpoints retention dropped are deleted (before the next save,
        and before the process ends)."""
        deleting, self._deleting = self._deleting, None
        if deleting is not None:
            deleting.join()

    def _delete(self, paths: list[Path]) -> None:
        """Delete ``paths``. Large checkpoints are moved out of sight at once (a rename:
        ``auto``, ``latest`` and the next prune no longer see them) and deleted on a
        thread: freeing the blocks of a few hundred MB can take half a second, which no
        save need wait for. A process killed first leaves ``.tmp-`` directories, which
        the next save removes."""
        size = 0
        for path in paths:
            with contextlib.suppress(CheckpointCorrupt):
                size += sum(entry["bytes"] for entry in read_manifest(path)["files"].values())
        if size < DELETE_LATER_BYTES:
            for path in paths:
                shutil.rmtree(path, ignore_errors=True)
            return
        doomed = []
        for index, path in enumerate(paths):
            moved = self.directory / f"{TMP_PREFIX}pruned-{path.name}-{os.getpid()}-{index}"
            try:
                os.rename(path, moved)
            except OSError:
                shutil.rmtree(path, ignore_errors=True)
                continue
            doomed.append(moved)
        if doomed:
            def delete() -> None:
                for path in doomed:
                    shutil.rmtree(path, ignore_errors=True)
                _deletions.discard(thread)

            thread = threading.Thread(target=delete, name="checkpoint-retention", daemon=True)
            _deletions.add(thread)
            self._deleting = thread
            thread.start()

    def _prune(self) -> None:
        """Keep the newest ``keep_last`` verified checkpoints of this run; delete older
        ones of this run. Damaged and foreign directories count for nothing."""
        self.wait_for_deletions()
        dropped: list[Path] = []
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
                dropped.append(ref.path)
                self._verified.discard(ref.path)
        self._delete(dropped)
