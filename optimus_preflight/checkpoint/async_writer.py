"""Checkpoints written in the background (``checkpoint.async_save=true``).

The training thread copies the state into host memory (``HostSnapshot``: later optimizer
steps cannot change what is written) and hands the copy to a writer thread, which runs
the same ``CheckpointStore.save`` as a synchronous save: temporary directory, fsync,
rename, ``latest`` pointer, manifest, retention. At most one write is in flight; the
owner (``RunCheckpointer``) waits for it before the next save, on a stop signal and at
the end of training, and turns a failed write into a StorageError at the next step
boundary.

The host copy is kept from one save to the next (its buffers are reused, pinned when
the state lives on a GPU): ``async_save`` costs one extra copy of the checkpointed state
in host memory for the rest of the run.
"""

from __future__ import annotations

import copy
import ctypes
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from optimus_preflight.checkpoint.store import CheckpointStore
from optimus_preflight.checkpoint.tensor_file import bytes_view, map_tensors, storage_key, unsupported_reason

log = logging.getLogger("optimus_preflight")


COPY_CHUNK = 16 << 20  # bytes per memmove call


class HostSnapshot:
    """Copies of a state in host memory; storages are copied whole, so views of one
    storage stay views of one copy. The buffers of one snapshot are reused by the next
    (the caller makes sure the previous one is no longer being written): no page of
    them is faulted in again.

    CPU storages are copied with plain memmoves of 16 MB spread over a few threads
    (they release the GIL): torch's per-tensor copy_ splits every tensor across all of
    its intra-op threads and waits for the slowest, which costs several times more on a
    busy machine. GPU storages go to pinned buffers with asynchronous copies."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []
        self.nbytes = 0
        self._threads = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))

    def _buffer(self, index: int, nbytes: int, pinned: bool) -> torch.Tensor:
        if index < len(self._buffers):
            buffer = self._buffers[index]
            if buffer.numel() == nbytes and buffer.is_pinned() == pinned:
                return buffer
        buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        if index < len(self._buffers):
            self._buffers[index] = buffer
        else:
            self._buffers.append(buffer)
        return buffer

    def take(self, state: Any) -> Any:
        copies: dict[int, torch.UntypedStorage] = {}
        moves: list[tuple[int, int, int]] = []  # (destination, source, bytes): CPU to CPU
        devices: set[torch.device] = set()  # GPUs with copies in flight

        def copy_tensor(tensor: torch.Tensor) -> torch.Tensor:
            if unsupported_reason(tensor) is not None:  # saved by torch.save: a plain copy will do
                return tensor.detach().to("cpu", copy=True)
            if tensor.device.type == "meta":
                return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
            key = storage_key(tensor)
            if key not in copies:
                storage = tensor.untyped_storage()
                buffer = self._buffer(len(copies), storage.nbytes(), pinned=tensor.device.type == "cuda")
                if tensor.device.type != "cpu":
                    buffer.copy_(bytes_view(storage), non_blocking=tensor.device.type == "cuda")
                    if tensor.device.type == "cuda":
                        devices.add(tensor.device)
                else:
                    moves.extend((buffer.data_ptr() + start, storage.data_ptr() + start, min(COPY_CHUNK, storage.nbytes() - start))
                                 for start in range(0, storage.nbytes(), COPY_CHUNK))
                copies[key] = buffer.untyped_storage()
            view = torch.empty(0, dtype=tensor.dtype).set_(copies[key], tensor.storage_offset(), tensor.shape, tensor.stride())
            if isinstance(tensor, nn.Parameter):
                return nn.Parameter(view, requires_grad=tensor.requires_grad)
            return view.requires_grad_(tensor.requires_grad) if tensor.requires_grad else view

        # Tensors inside other objects are deep-copied with them.
        snapshot = map_tensors(state, copy_tensor, copy.deepcopy)
        # The sources stay alive meanwhile: ``state`` holds them.
        if len(moves) > 1 and self._threads > 1:
            with ThreadPoolExecutor(self._threads, thread_name_prefix="checkpoint-copy") as pool:
                list(pool.map(lambda move: ctypes.memmove(*move), moves))
        else:
            for move in moves:
                ctypes.memmove(*move)
        for device in devices:
            torch.cuda.synchronize(device)
        del self._buffers[len(copies):]
        self.nbytes = sum(buffer.numel() for buffer in self._buffers)
        return snapshot


@dataclass
class BackgroundSave:
    step: int
    blocked_s: float  # the training thread's share: waiting for the previous write + the host copy
    waited_s: float  # of which: waiting for the previous write
    path: Path | None = None
    write_s: float = 0.0
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class BackgroundWriter:
    """One checkpoint write at a time on a thread of its own."""

    def __init__(self, store: CheckpointStore, on_done: Callable[[BackgroundSave], object] = lambda save: None):
        self.store = store
        self.on_done = on_done
        self.snapshot = HostSnapshot()
        self._job: BackgroundSave | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> BackgroundSave | None:
        """The save submitted last and not yet collected (running, or done)."""
        return self._job

    def submit(self, state: Any, step: int, *, started: float, waited_s: float) -> BackgroundSave:
        """Copy ``state`` to host memory (on this thread) and write it in the background.
        ``started``: when the training thread began this save (perf_counter)."""
        with self._lock:
            if self._job is not None:
                raise RuntimeError("a checkpoint write is already in flight; collect it with wait() first")
            snapshot = self.snapshot.take(state)
            job = BackgroundSave(step, blocked_s=time.perf_counter() - started, waited_s=waited_s)
            self._job = job
            self._thread = threading.Thread(target=self._write, args=(job, snapshot), name=f"checkpoint-step-{step}", daemon=True)
            self._thread.start()
        return job

    def _write(self, job: BackgroundSave, snapshot: Any) -> None:
        started = time.perf_counter()
        try:
            job.path = self.store.save(snapshot, job.step)
        except BaseException as error:  # noqa: BLE001 - reported to the training thread
            job.error = error
        finally:
            job.write_s = time.perf_counter() - started
            del snapshot
            try:
                self.on_done(job)
            finally:
                job.done.set()

    def wait(self) -> BackgroundSave | None:
        """Wait for the save in flight (if any) and collect it: the caller reports it."""
        with self._lock:
            job, thread = self._job, self._thread
            if job is None:
                return None
            while thread is not None and thread.is_alive():
                thread.join(0.1)  # short joins: signal handlers keep running meanwhile
            job.done.wait()
            self._job = self._thread = None
            return job

    def failure(self) -> BackgroundSave | None:
        """Without waiting: the save in flight if it has finished and failed (collected)."""
        job = self._job
        if job is None or not job.done.is_set() or job.error is None:
            return None
        return self.wait()
