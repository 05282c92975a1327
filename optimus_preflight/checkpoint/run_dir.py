"""The run directory: one process at a time, and nothing written until the run is valid.

``RunDirectory.open`` takes an exclusive lock (``fcntl.flock`` on ``.optimus.lock``:
the kernel drops it when the holder dies, even by kill -9, so a stale lock never
blocks anyone) and notes whether the directory already holds a run. Until ``commit``
(called once the config, model, optimizer and the checkpoint to resume from are all
known to be good) the run writes nothing there: Hydra's ``.hydra/`` files and
``train.log`` wait for it (see ``run_log``). A run that fails before committing leaves
an earlier run's directory exactly as it was; in a new directory it still writes its
log and a ``failed`` summary, which is what a sweep table and the user need.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from omegaconf import OmegaConf

from optimus_preflight.errors import StorageError, UserError, is_storage_error
from optimus_preflight.reporting.run_log import open_deferred_logs
from optimus_preflight.training.distributed import DistEnv, broadcast_object

log = logging.getLogger("optimus_preflight")

LOCK_FILE = ".optimus.lock"
HYDRA_SUBDIR = ".hydra"
# What an earlier run leaves behind; a directory holding none of these is new.
RUN_FILES = ("summary.json", "metrics.jsonl", "preflight.json", "checkpoints", "train.log", HYDRA_SUBDIR)
_NO_LOCKING = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def holds_a_run(directory: Path) -> bool:
    return any((directory / name).exists() for name in RUN_FILES)


@contextlib.contextmanager
def storage_errors(what: str, directory: Path) -> Iterator[None]:
    """A disk that refuses the write (read-only, full, not ours) is the user's to fix:
    StorageError (exit 2, one message); any other OSError stays a traceback."""
    try:
        yield
    except OSError as error:
        if not is_storage_error(error):
            raise
        raise StorageError.from_os_error(error, what, directory) from None


class RunDirLock:
    """An exclusive, non-blocking lock on a run directory, released on close or death."""

    def __init__(self, directory: Path):
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        while self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise UserError(
                    f"the run directory {self.path.parent} is in use by {holder}",
                    key="hydra.run.dir",
                    fix="Wait for that run to finish (or stop it), or give this run its own hydra.run.dir.",
                ) from None
            except OSError as error:
                if error.errno not in _NO_LOCKING:
                    raise
                log.warning("%s does not support file locks: two runs in one directory will not be stopped",
                            self.path.parent)
            if not self._same_file(fd):  # the previous holder removed the file after we opened it
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"process {os.getpid()} on {socket.gethostname()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})".encode())
            self._fd = fd

    def _same_file(self, fd: int) -> bool:
        try:
            return os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        if self._fd is None:
            return
        # Unlinked while still held: a process that opened the old file retries (_same_file).
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


class RunDirectory:
    """The run dir of one process: locked by the writer (rank 0) when ``lock`` (a run,
    not a bare setup from a notebook), written after ``commit``."""

    def __init__(self, path: Path, *, writer: bool = True, lock: bool = True):
        self.path = path
        self.writer = writer
        self.lock_required = lock
        self.lock = RunDirLock(path)
        self.held_a_run = False
        self.locked = False
        self.committed = False

    def open(self) -> None:
        with storage_errors("the run directory", self.path):
            self.path.mkdir(parents=True, exist_ok=True)
        if not self.writer:
            return
        self.held_a_run = holds_a_run(self.path)
        if self.lock_required:
            with storage_errors(f"the lock file {LOCK_FILE}", self.path):
                self.lock.acquire()
            self.locked = True

    @property
    def _owned(self) -> bool:
        return self.writer and (self.locked or not self.lock_required)

    def commit(self, task_config: object = None) -> None:
        """The run is valid: Hydra's files and the held log lines go to disk."""
        if self.committed or not self._owned:
            return
        self.committed = True
        with storage_errors(f"{HYDRA_SUBDIR}/", self.path):
            write_hydra_files(self.path, task_config)
        open_deferred_logs()

    @property
    def may_write(self) -> bool:
        """Whether this process may write here: it owns the directory, and the run is
        valid or the directory held no earlier run that a failed start could overwrite."""
        return self._owned and (self.committed or not self.held_a_run)

    def close(self) -> None:
        self.lock.release()
        self.locked = False


def open_run_directory(path: Path, dist: DistEnv, *, lock: bool) -> RunDirectory:
    """Open (and for a run, lock) the run dir. Rank 0 takes the lock; under torchrun
    every rank learns whether it got it, so all stop together with the same message."""
    directory = RunDirectory(path, writer=dist.is_main, lock=lock)
    refusal: UserError | None = None
    try:
        directory.open()
    except UserError as error:
        refusal = error
    if lock and dist.is_distributed:
        message = broadcast_object(str(refusal) if refusal else None)
        if message and refusal is None:
            refusal = UserError(message)
    if refusal is not None:
        raise refusal
    return directory


def write_hydra_files(run_dir: Path, task_config: object) -> None:
    """What Hydra writes at job start (its ``output_subdir`` is off in conf/config.yaml,
    so that an invalid run cannot rewrite them): the composed config, Hydra's own and
    the command-line overrides."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or task_config is None:
        return
    hydra_cfg = HydraConfig.instance().cfg
    target = run_dir / HYDRA_SUBDIR
    target.mkdir(exist_ok=True)
    for name, node in (("config.yaml", task_config), ("hydra.yaml", hydra_cfg),
                       ("overrides.yaml", hydra_cfg.hydra.overrides.task)):
        (target / name).write_text(OmegaConf.to_yaml(node), encoding="utf-8")
