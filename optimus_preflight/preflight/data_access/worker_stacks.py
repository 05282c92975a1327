"""Stacks of hung data code, and shutting DataLoader workers down without waiting on them.

Each worker registers ``faulthandler`` on SIGUSR2 in a wrapped ``worker_init_fn``;
sent SIGUSR2, a worker writes the Python stacks of all its threads to a file, from a C
signal handler, so it works while the worker sits in ``time.sleep``, a lock or a read.
(py-spy would need ptrace rights and an extra binary; /proc only shows native stacks.)
The frame named as "the hang" is the innermost one outside torch, the standard library
and this package: the user's code that blocks.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import re
import shutil
import signal
import sysconfig
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch

DUMP_SIGNAL = getattr(signal, "SIGUSR2", None)
_KEEP_OPEN: list[Any] = []
_TORCH_DIR = str(Path(torch.__file__).parent)
_STDLIB_DIRS = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})
# The guard's own frames sit between the caller and the user's code in every stack.
OWN_FILES = frozenset(str(Path(__file__).with_name(name)) for name in ("fetch.py", "worker_stacks.py"))


def is_library_file(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR) or filename.startswith(_STDLIB_DIRS) or filename in OWN_FILES


def without_comment(code: str) -> str:
    """A line of code without its trailing comment (a '#' outside quotes)."""
    quote = None
    for index, char in enumerate(code):
        if quote is None and char in "'\"":
            quote = char
        elif char == quote:
            quote = None
        elif char == "#" and quote is None:
            return code[:index].rstrip()
    return code


def frame_text(filename: str, lineno: int, name: str) -> str:
    """'File "x.py", line 12, in __getitem__: time.sleep(3600)'."""
    code = without_comment(linecache.getline(filename, lineno).strip())
    return f'File "{filename}", line {lineno}, in {name}' + (f": {code}" if code else "")


_PACKAGE = str(Path(__file__).parents[2])  # optimus_preflight/, as frames name it


def user_frame_text(frame: Any, through_package: bool = True) -> str | None:
    """The first frame from ``frame`` outwards that is the user's code (not torch, the standard
    library or this package), as ``frame_text`` writes it: where a torch call was made. Without
    ``through_package``, none when this package made the call (a criterion passed as
    ``loss_fn`` and called by the default loss): the user's line further out is not the call."""
    while frame is not None:
        name = frame.f_code.co_filename
        # the preflight's other torch-function modes pass each call on to the next: not a caller
        if name.startswith(_PACKAGE) and not through_package and frame.f_code.co_name != "__torch_function__":
            return None
        if not is_library_file(name) and not name.startswith(_PACKAGE):
            return frame_text(name, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None


def innermost_first(stack: traceback.StackSummary) -> list[str]:
    return [f'File "{f.filename}", line {f.lineno}, in {f.name}' for f in reversed(stack) if f.filename not in OWN_FILES]


def hang_frame_from_stack(stack: traceback.StackSummary) -> str | None:
    """The innermost user frame of a stack (oldest call first), else its innermost frame."""
    frames = [f for f in stack if f.filename not in OWN_FILES]
    for frame in reversed(frames):
        if not is_library_file(frame.filename):
            return frame_text(frame.filename, frame.lineno, frame.name)
    return frame_text(frames[-1].filename, frames[-1].lineno, frames[-1].name) if frames else None


_FAULTHANDLER_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)')


def hang_from_faulthandler(dump: str) -> tuple[str | None, list[str], bool]:
    """(the hang frame, its thread's frames innermost first, whether it is user code).

    faulthandler writes one block per thread, most recent call first. A thread with a
    user frame wins; else the innermost frame of the first thread (an idle worker).
    """
    blocks = [block for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip()) if block.strip()]
    parsed = [list(_FAULTHANDLER_FRAME.finditer(block)) for block in blocks]
    for frames in parsed:
        for match in frames:
            if not is_library_file(match["file"]):
                stack = [f'File "{m["file"]}", line {m["line"]}, in {m["name"]}' for m in frames]
                return frame_text(match["file"], int(match["line"]), match["name"]), stack, True
    frames = next((frames for frames in parsed if frames), [])
    if not frames:
        return None, [], False
    first = frames[0]
    stack = [f'File "{m["file"]}", line {m["line"]}, in {m["name"]}' for m in frames]
    return frame_text(first["file"], int(first["line"]), first["name"]), stack, False


class DumpStacksOnSignal:
    """worker_init_fn wrapper: registers faulthandler, then runs the user's init."""

    def __init__(self, inner: Callable[[int], None] | None, directory: str):
        self.inner = inner
        self.directory = directory

    def __call__(self, worker_id: int) -> None:
        if DUMP_SIGNAL is not None:
            handle = open(os.path.join(self.directory, f"worker-{worker_id}.txt"), "w")
            _KEEP_OPEN.append(handle)  # faulthandler writes to the fd; keep the file alive
            faulthandler.register(DUMP_SIGNAL, file=handle, all_threads=True)
        if self.inner is not None:
            self.inner(worker_id)


class StacksDirectory:
    """The temporary directory watched workers write their stacks into, made only when the
    first workers start (most runs never make one) and named with this process's pid, so
    that the next one removes the directories of processes that died without removing
    theirs (kill -9, an OOM kill)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.created: str | None = None

    @property
    def path(self) -> str:
        if self.created is None:
            remove_orphaned_stacks(self.prefix)
            self.created = tempfile.mkdtemp(prefix=f"{self.prefix}{os.getpid()}-")
        return self.created

    def remove(self) -> None:
        if self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)
            self.created = None


def remove_orphaned_stacks(prefix: str, root: str | None = None) -> None:
    """Remove ``<prefix><pid>-*`` directories whose process is gone. A pid reused by another
    process keeps its directory (the safe side); an unreadable one is left alone."""
    root = root or tempfile.gettempdir()
    try:
        names = [name for name in os.listdir(root) if name.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def dump_worker_stacks(iterator: Any, directory: str, wait_s: float = 2.0) -> dict[str, str]:
    workers = [w for w in getattr(iterator, "_workers", []) if w.is_alive()]
    if DUMP_SIGNAL is None:
        return {}
    for worker in workers:
        try:
            os.kill(worker.pid, DUMP_SIGNAL)
        except ProcessLookupError:
            pass
    stacks: dict[str, str] = {}
    deadline = time.monotonic() + wait_s
    for index, worker in enumerate(getattr(iterator, "_workers", [])):
        path = Path(directory) / f"worker-{index}.txt"
        text = ""
        while time.monotonic() < deadline:
            text = path.read_text() if path.exists() else ""
            if text.strip():
                time.sleep(0.05)  # let faulthandler finish writing every thread
                text = path.read_text()
                break
            time.sleep(0.02)
        stacks[f"worker {index} (pid {worker.pid})"] = text or "(no stack: the worker did not reach worker_init_fn)"
    return stacks


def _unwatch(iterator: Any) -> None:
    """Take the workers off torch's SIGCHLD watch: a worker we end must not raise
    'DataLoader worker (pid N) is killed by signal' in this process."""
    if getattr(iterator, "_worker_pids_set", False):
        from torch.utils.data import _utils

        _utils.signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False


def stop_workers(iterator: Any, hung: bool, grace_s: float = 0.5) -> None:
    """Shut a DataLoader iterator's workers down within about ``grace_s``.

    torch's own shutdown joins each worker for 5 s in turn before killing it, so a
    worker stuck in user code (a hung one, or a healthy-looking iterator's worker busy
    on a prefetched batch that never comes) would hold preflight 5 s per worker. Here
    healthy workers are asked to exit (torch's protocol: the done event and a None
    index) and joined together; hung ones are terminated at once; whoever is still
    alive at the deadline is terminated, then killed. torch's shutdown then only closes
    the queues and the pin-memory thread.
    """
    workers = list(getattr(iterator, "_workers", []))
    _unwatch(iterator)
    if getattr(iterator, "_shutdown", False):
        return  # exhausted: torch already joined its workers and closed their queues
    if hasattr(iterator, "_workers_done_event"):
        iterator._workers_done_event.set()
    for index, worker in enumerate(workers):
        if hung and worker.is_alive():
            worker.terminate()
        elif not hung and index < len(getattr(iterator, "_index_queues", [])):
            iterator._index_queues[index].put(None)
    deadline = time.monotonic() + grace_s
    for worker in workers:
        worker.join(timeout=max(deadline - time.monotonic(), 0.01))
    for worker in workers:
        if worker.is_alive():
            worker.terminate()
            worker.join(timeout=grace_s)
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=1.0)
    if hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
