"""Checkpoints written in the background (``checkpoint.async_save=true``), with ``dcp.async_save``.

On the training thread the state is taken apart (dcp_io.split_state) and
``dcp.async_save`` stages its tensors into host memory through ``HostStager`` (later
optimizer steps cannot change what is written), then writes them on DCP's own thread into
the checkpoint's temporary directory. A writer thread of ours waits for that write and
finishes the checkpoint with the same ``CheckpointStore.save`` as a synchronous save:
``state.pt``, manifest, fsync, rename, ``latest`` pointer, retention. At most one write is
in flight; the owner (``RunCheckpointer``) waits for it before the next save, on a stop
signal and at the end of training, and turns a failed write into a StorageError at the
next step boundary.

The host copy is kept from one save to the next (its buffers are reused, pinned when
the state lives on a GPU): ``async_save`` costs one extra copy of the checkpointed state
in host memory for the rest of the run.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import AsyncStager

from optimus_preflight.checkpoint import dcp_io
from optimus_preflight.checkpoint.store import CheckpointStore

log = logging.getLogger("optimus_preflight")


COPY_CHUNK = 16 << 20  # bytes per copy call


class HostStager(AsyncStager):
    """DCP's stager: copies of a flat ``{key: tensor}`` in host memory, into buffers
    reused by the next save (the caller makes sure the previous one is written): no page
    of them is faulted in again.

    CPU tensors are copied in 16 MB pieces spread over a few threads as NumPy byte copies
    (they release the GIL and run single-threaded each): torch's copy_ splits every tensor
    across all of its intra-op threads and waits for the slowest, which costs several
    times more on a busy machine. GPU tensors go to pinned buffers with asynchronous
    copies."""

    _synchronize_after_execute = False  # stage() returns once the copy is complete

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self.nbytes = 0
        self._threads = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))

    def _buffer(self, key: str, tensor: torch.Tensor, pinned: bool) -> torch.Tensor:
        buffer = self._buffers.get(key)
        if (buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype
                or buffer.is_pinned() != pinned):
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinned)
            self._buffers[key] = buffer
        return buffer

    def stage(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:  # type: ignore[override]
        staged: dict[str, torch.Tensor] = {}
        pieces: list[tuple[Any, Any]] = []  # (destination, source) NumPy byte views: CPU to CPU
        devices: set[torch.device] = set()  # GPUs with copies in flight
        for key, tensor in state_dict.items():
            buffer = self._buffer(key, tensor, pinned=tensor.device.type == "cuda")
            staged[key] = buffer
            if tensor.device.type != "cpu":
                buffer.copy_(tensor, non_blocking=tensor.device.type == "cuda")
                if tensor.device.type == "cuda":
                    devices.add(tensor.device)
            elif not tensor.is_contiguous() or not tensor.numel():
                buffer.copy_(tensor)
            else:
                source = tensor.detach().reshape(-1).view(torch.uint8).numpy()
                target = buffer.reshape(-1).view(torch.uint8).numpy()
                pieces.extend((target[start:start + COPY_CHUNK], source[start:start + COPY_CHUNK])
                              for start in range(0, source.size, COPY_CHUNK))
        copy_piece = lambda piece: piece[0].__setitem__(slice(None), piece[1])  # noqa: E731
        if len(pieces) > 1 and self._threads > 1:
            with ThreadPoolExecutor(self._threads, thread_name_prefix="checkpoint-copy") as pool:
                list(pool.map(copy_piece, pieces))
        else:
            for piece in pieces:
                copy_piece(piece)
        for device in devices:
            torch.cuda.synchronize(device)
        for key in [key for key in self._buffers if key not in state_dict]:
            del self._buffers[key]
        self.nbytes = sum(buffer.nbytes for buffer in self._buffers.values())
        return staged

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        self._buffers.clear()


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
        self.snapshot = HostStager()
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
            index, tensors = dcp_io.split_state(state)
            index = copy.deepcopy(index)  # the rest of the state as it is now (meta placeholders cost nothing)
            tmp = self.store.prepare(step)
            try:
                written = self._start_write(tensors, tmp) if tensors else None
            except BaseException:
                self.store.discard(tmp)
                raise
            job = BackgroundSave(step, blocked_s=time.perf_counter() - started, waited_s=waited_s)
            self._job = job
            self._thread = threading.Thread(target=self._write, args=(job, index, written, tmp),
                                            name=f"checkpoint-step-{step}", daemon=True)
            self._thread.start()
        return job

    def _start_write(self, tensors: dict[str, torch.Tensor], tmp: Path) -> Future:
        """Stage ``tensors`` (on this thread) and write them on another. ``dcp.async_save``
        refuses a process group without a CPU backend even when told no_dist (DDP on
        NCCL, where rank 0 alone writes): there the same two steps run by hand."""
        if not (torch.distributed.is_initialized() and "cpu" not in str(torch.distributed.get_backend_config())):
            return dcp.async_save(tensors, storage_writer=dcp_io.writer(tmp), async_stager=self.snapshot, no_dist=True)
        staged = self.snapshot.stage(tensors)
        executor = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-dcp")
        future = executor.submit(dcp_io.save_tensors, tmp, staged)
        executor.shutdown(wait=False)
        return future

    def _write(self, job: BackgroundSave, index: Any, written: Future | None, tmp: Path) -> None:
        started = time.perf_counter()
        try:
            if written is not None:
                with dcp_io.plain_errors():
                    written.result()  # DCP's thread: the tensors, fsynced
            job.path = self.store.save(index, job.step, prepared=tmp)
        except BaseException as error:  # noqa: BLE001 - reported to the training thread
            self.store.discard(tmp)
            job.error = error
        finally:
            job.write_s = time.perf_counter() - started
            del index
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
