"""RunCheckpointer: the checkpoints of one run (periodic, final, on a stop) and its resume.

Stop signals and forced exits are ``StopControl``'s (stop_control.py), the ranks'
agreement and the stuck-collective watchdog ``PeerWatch``'s (peer_watch.py); the loop
(TrainingInterruptionMixin) calls the three.

Why this module is long (~350 lines): synchronous, background and FSDP-sharded saves
share one ordering (wait for the write in flight, then write) and one resume, so they
stay in one place.

With ``checkpoint.async_save=true`` the periodic checkpoints (those ``due`` asked for) are
copied to host memory on the training thread and written by a background thread
(async_writer.py), one at a time. Every other save (the final one, on a stop signal,
after a worker death or a silent peer) first waits for the write in flight, then writes
synchronously, so the run never ends with a checkpoint half written. A background write
that failed stops the run at the next step boundary (StorageError, exit 2). FSDP
checkpoints, which every rank writes together, are always synchronous.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import torch

from optimus_preflight.checkpoint.async_writer import BackgroundSave, BackgroundWriter
from optimus_preflight.checkpoint.checkpoint_state import Restorable, apply_state, build_state
from optimus_preflight.checkpoint.resume import (
    ResumePoint,
    apply_lr_change,
    check_model_fits,
    check_optimizer_fits,
    log_config_changes,
    pick_resume_point,
    refresh_schedule,
    settle_resume,
)
from optimus_preflight.checkpoint.store import CheckpointStore, read_manifest
from optimus_preflight.config.changes import config_changes
from optimus_preflight.errors import StorageError, UserError
from optimus_preflight.training import rng
from optimus_preflight.training.distributed import DistEnv, broadcast_object, unwrap
from optimus_preflight.training.peers import main_thread_in
from optimus_preflight.training.sharding import is_sharded

log = logging.getLogger("optimus_preflight")


def _gpu_busy(model: Any, wait_s: float = 5.0) -> bool:
    """Whether the weights' CUDA stream still has work queued after ``wait_s``: behind
    a collective a dead peer never joins, it never finishes. Asks without blocking."""
    device = next((p.device for p in model.parameters() if p.is_cuda), None)
    if device is None:
        return False
    stream = torch.cuda.current_stream(device)
    deadline = time.monotonic() + wait_s
    while not stream.query():
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)
    return False


def _saved_shapes(path: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a sharded checkpoint, as meta tensors of their global shapes."""
    from optimus_preflight.checkpoint.sharded import saved_tensor_shapes

    return {name: torch.empty(shape, device="meta") for name, shape in saved_tensor_shapes(path).items()}


class RunCheckpointer:
    def __init__(
        self,
        run_dir: Path,
        *,
        every_n_steps: int,
        keep_last: int,
        dist: DistEnv,
        config: dict[str, Any],
        async_save: bool | None = None,
    ):
        self.run_dir = run_dir
        self.every_n_steps = every_n_steps
        self.dist = dist
        self.config = config
        # A fresh run's identity; a resume adopts the checkpoint's.
        self.store = CheckpointStore(run_dir / "checkpoints", keep_last, run_id=uuid.uuid4().hex[:16])
        self._resume_point: ResumePoint | None = None
        self.parts: Restorable | None = None
        self.boundary_rng: dict[str, Any] | None = None
        self.resumed_from: Path | None = None
        self.last_saved: Path | None = None
        # Set by the loop once training started: the preflight's steps change the weights,
        # and a forced save must never write those.
        self.training_started = False
        # Called before each checkpoint is written: the metric files are made durable, so
        # a resume after any kill finds every step up to the checkpoint's on disk.
        self.before_save: list[Callable[[], None]] = []
        # Under torchrun, the barrier every rank passes after a save (PeerWatch.after_save).
        self.after_save: Callable[[Path | None], None] | None = None
        self.sharded = False
        # checkpoint.async_save (read from the config when not given).
        self.async_save = bool((config.get("checkpoint") or {}).get("async_save", False)) if async_save is None else async_save
        self.background: BackgroundWriter | None = None
        self._due_step: int | None = None  # the step due() last said a periodic checkpoint is due at
        self.closed = True  # until start()

    def start(self, parts: Restorable) -> None:
        self.parts = parts
        self.closed = False
        # FSDP2 under torchrun: every rank writes its shard (DCP); no rank holds the whole model.
        self.sharded = self.dist.is_distributed and is_sharded(unwrap(parts.model))
        if self.async_save and self.sharded:
            if self.dist.is_main:
                log.warning("checkpoint.async_save=true: FSDP checkpoints are written by every rank together (DCP), "
                            "so they are saved synchronously")
        elif self.async_save and self.dist.is_main:
            self.background = BackgroundWriter(self.store, on_done=self._background_done)

    def close(self) -> None:
        self.closed = True
        # A run ending on an error still finishes the checkpoint in flight.
        if self.background is not None:
            job = self.background.wait()
            if job is not None and job.error is not None:
                log.error("%s", self._background_error(job))
        self.store.wait_for_deletions()

    def last_checkpoint(self) -> Path | None:
        """The newest checkpoint of this run known to be complete on disk."""
        return self.last_saved or self.resumed_from

    def save_last_step(self, from_main_thread: bool = True) -> Path | str:
        """Rank 0's checkpoint of the last completed step (under DDP its weights are the
        whole model), or why there is none."""
        if self.sharded:
            return "under FSDP every rank writes its own shard, and a silent rank cannot"
        if not self.dist.is_main:
            return "rank 0 writes the checkpoints"
        if not self.training_started or self.parts is None:
            return "training had not started"
        # The main thread is parked in a collective (off it) or at a step boundary, so
        # the state is that of the last boundary, unless it was updating the weights.
        if not from_main_thread and main_thread_in("/torch/optim/"):
            return "the main thread was updating the weights"
        if _gpu_busy(unwrap(self.parts.model)):
            return "the GPU still waits on the unfinished collective, so copying the weights would hang"
        if self.background is not None:
            self.background.wait()  # one write at a time; a failed one is superseded by this one
        step = self.parts.run_state.step
        if self.last_saved is not None and self.last_saved.name == f"step_{step:08d}":
            return self.last_saved
        return self._write()

    # ------------------------------------------------------------------- saving
    def mark_boundary(self) -> None:
        """The RNG state at a step boundary: what a resumed run must start from, even
        when the stop comes halfway through the next window."""
        self.raise_if_background_failed()
        self.boundary_rng = rng.capture()

    def due(self, step: int) -> bool:
        due = bool(self.every_n_steps) and step % self.every_n_steps == 0
        if due:
            self._due_step = step
        return due

    def save(self) -> Path | None:
        """Rank 0 writes; every rank waits for it, so no rank runs ahead of a checkpoint.
        With async_save, a periodic checkpoint is only copied here and written in the
        background; any other save waits for that write and writes synchronously."""
        assert self.parts is not None
        step = self.parts.run_state.step
        name = f"step_{step:08d}"
        in_flight = self.background.in_flight if self.background is not None else None
        if in_flight is not None and in_flight.step == step:
            return self.finish_background()  # e.g. the final checkpoint or a stop at a periodic step
        if self.last_saved is not None and self.last_saved.name == name:
            return self.last_saved  # e.g. the final checkpoint at a periodic step
        for hook in self.before_save:
            hook()
        background = self.background is not None and self._due_step == step
        if background:
            path = self._write_in_background(step)
        else:
            self.finish_background()
            path = self._write() if self.dist.is_main or self.sharded else None
        if self.after_save is not None:
            self.after_save(path)
        if background:
            return path  # being written: last_saved names it once it is complete
        self.last_saved = path or self.store.directory / name
        return self.last_saved

    # ------------------------------------------------------- background saves
    def _write_in_background(self, step: int) -> Path:
        """The training thread's part of a background save: wait for the previous write
        (at most one in flight), copy the state to host memory, hand it over."""
        assert self.parts is not None and self.background is not None
        started = time.perf_counter()
        self.finish_background()
        waited = time.perf_counter() - started
        state = build_state(self.parts, rng_state=self.boundary_rng or rng.capture(), config=self.config,
                            world_size=self.dist.world_size)
        job = self.background.submit(state, step, started=started, waited_s=waited)
        log.debug("checkpoint step_%08d: copied to host memory in %.3f s; writing it in the background", step, job.blocked_s)
        return self.store.directory / f"step_{step:08d}"

    def _background_done(self, job: BackgroundSave) -> None:
        """On the writer thread, as a write ends: a complete checkpoint is named at once
        (a forced exit's message), a failure said at once (the run stops at the next
        step boundary)."""
        if job.error is not None:
            log.error("checkpoint step_%08d failed in the background after %.2f s (%s); the run stops at the next step boundary",
                      job.step, job.write_s, str(job.error).split(". ")[0])
            return
        self.last_saved = job.path
        log.info("checkpoint %s (written in the background in %.2f s; training blocked %.3f s: %.3f s waiting for the "
                 "previous write, %.3f s copying %.1f MB to host memory)", job.path.relative_to(self.run_dir), job.write_s,
                 job.blocked_s, job.waited_s, job.blocked_s - job.waited_s, self.background.snapshot.nbytes / 1e6)

    def _background_error(self, job: BackgroundSave) -> BaseException:
        error = job.error
        if isinstance(error, OSError):
            error = StorageError.from_os_error(error, f"checkpoint step_{job.step:08d}", self.store.directory)
        if isinstance(error, UserError):
            return type(error)(f"the background write of a checkpoint (checkpoint.async_save=true) failed: {error.message}",
                               key=error.key, fix=error.fix)
        return error

    def finish_background(self) -> Path | None:
        """Wait for the background write in flight, if any: its path, or its failure
        raised (StorageError: exit 2)."""
        in_flight = self.background.in_flight if self.background is not None else None
        if in_flight is not None and not in_flight.done.is_set():
            log.info("waiting for checkpoint step_%08d to be written in the background", in_flight.step)
        job = self.background.wait() if self.background is not None else None
        if job is None:
            return None
        if job.error is not None:
            raise self._background_error(job)
        return job.path

    def raise_if_background_failed(self) -> None:
        """At a step boundary: a background write that failed ends the run here."""
        job = self.background.failure() if self.background is not None else None
        if job is not None:
            raise self._background_error(job)

    def _write(self) -> Path:
        assert self.parts is not None
        started = time.perf_counter()
        step = self.parts.run_state.step
        state = build_state(self.parts, rng_state=self.boundary_rng or rng.capture(), config=self.config,
                            world_size=self.dist.world_size, sharded=self.sharded)
        prepared = self._write_shards(step) if self.sharded else None
        # Known before any barrier: a forced exit while the others wait names this one.
        self.last_saved = self.store.save(state, step, prepared=prepared) if self.dist.is_main else self.store.directory / f"step_{step:08d}"
        log.info("checkpoint %s (%.2f s, training blocked throughout)", self.last_saved.relative_to(self.run_dir),
                 time.perf_counter() - started)
        return self.last_saved

    def _write_shards(self, step: int) -> Path:
        """Every rank writes its shard of the model and optimizer into the directory rank
        0 prepared (collective); rank 0 then adds state.pt and the manifest."""
        from optimus_preflight.checkpoint.sharded import save_sharded  # DCP: a second of import

        prepared: tuple[str, Any] = ("", None)
        if self.dist.is_main:
            try:
                prepared = ("ok", self.store.prepare(step))
            except UserError as error:
                prepared = ("error", error)
        outcome, value = broadcast_object(prepared)
        if outcome == "error":
            raise value
        try:
            save_sharded(unwrap(self.parts.model), self.parts.optimizer, value)
        except Exception as error:  # DCP re-raises any rank's failure on every rank
            if self.dist.is_main:
                self.store.discard(value)
            cause = error if isinstance(error, OSError) else OSError(5, f"a rank's shard write failed: {str(error).splitlines()[0][:300]}")
            raise StorageError.from_os_error(cause, f"checkpoint step_{step:08d}", self.store.directory) from None
        return value

    # ------------------------------------------------------------------ resuming
    def resume(self, resume: str, *, training: bool = True) -> Path | None:
        """Load the chosen checkpoint into the live objects (the run state included);
        return its path, or None for a fresh start (said only when ``training``: a
        preflight-only run starts nothing).

        Reads only: what the resume changes on disk waits for ``settle`` (called once
        the run is known to be valid), so a bad resume leaves the run dir as it was.
        """
        assert self.parts is not None
        point = pick_resume_point(resume, self.store)
        if point is None:
            if resume == "auto" and training:
                log.info("no checkpoint in %s: starting fresh", self.store.directory)
            return None
        state, path = point.state, point.path
        model = unwrap(self.parts.model)
        check_model_fits(model, state["model"] if "model" in state else _saved_shapes(path), path)
        check_optimizer_fits(self.parts.optimizer, state, path)
        try:
            if "sharded" in state:
                from optimus_preflight.checkpoint.sharded import load_sharded  # DCP: a second of import

                load_sharded(model, self.parts.optimizer, path)
            world_note = apply_state(self.parts, state, world_size=self.dist.world_size)
        except (KeyError, ValueError, RuntimeError, TypeError) as error:  # e.g. another scheduler's state
            raise UserError(
                f"checkpoint {path} does not load into this run's objects ({type(error).__name__}: {error})",
                key="checkpoint.resume",
                fix="Resume with the config the checkpoint was trained with, or start a new run in a new hydra.run.dir.",
            ) from None
        changes = config_changes(state.get("config") or {}, self.config)
        log_config_changes(changes, allowed=bool((self.config.get("checkpoint") or {}).get("allow_config_change", True)))
        old_lr, new_lr = changes.get("optimizer.lr", (None, None))
        apply_lr_change(self.parts.optimizer, self.parts.scheduler, old_lr, new_lr)
        if self.parts.scheduler is not None:
            refresh_schedule(self.parts.optimizer, self.parts.scheduler)
        self.boundary_rng = rng.from_checkpoint(state["rng"])
        rng.restore(self.boundary_rng)
        self.resumed_from = path
        # The resumed run continues that run's checkpoints (retention, same-step reuse).
        self.store.run_id = read_manifest(path).get("run_id")
        self._resume_point = point
        if world_note and self.dist.is_main:
            log.warning("resuming at another world size: %s", world_note)
        position = self.parts.stream.state_dict()
        log.info(
            "resumed from %s: step %d, epoch %d, %d samples into the epoch",
            path,
            self.parts.run_state.step,
            position["epoch"],
            position["samples_consumed"],
        )
        return path

    def settle(self) -> None:
        """The disk side of the resume, once the run is valid: newer checkpoints that
        the resume passed over are set aside (rank 0)."""
        point, self._resume_point = self._resume_point, None
        if point is not None and self.dist.is_main:
            point.state = {"run_state": point.state["run_state"]}  # drop the tensors: only the step is needed
            settle_resume(self.store, point)
