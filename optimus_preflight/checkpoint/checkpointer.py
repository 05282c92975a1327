"""RunCheckpointer: periodic, final and on-signal checkpoints of one run, and its resume."""

from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from optimus_preflight import rng
from optimus_preflight.checkpoint.resume import (
    apply_lr_change,
    check_model_fits,
    choose_checkpoint,
    config_changes,
    log_config_changes,
    refresh_schedule,
    set_aside_newer,
)
from optimus_preflight.checkpoint.state import Restorable, apply_state, build_state, unwrap
from optimus_preflight.checkpoint.store import CheckpointStore
from optimus_preflight.distributed import DistEnv
from optimus_preflight.signals import StopSignals

log = logging.getLogger("optimus_preflight")


def resume_command(run_dir: Path) -> str:
    """The command that continues this run: same overrides, same run dir, resume=auto."""
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    except Exception:  # not launched through the Hydra app
        overrides = []
    keep = [o for o in overrides if not o.startswith(("hydra.run.dir=", "checkpoint.resume="))]
    program = ["optimus-train"]
    script = sys.argv[0] if sys.argv else ""
    # A user script calling MyRecipe.main() is resumed through that script; launchers'
    # own entry points (submitit, torchrun) are not something to type.
    installed = any(part in ("site-packages", "dist-packages") for part in Path(script).parts)
    if script.endswith(".py") and not installed and Path(script).resolve() != Path(__file__).resolve().parents[1] / "cli.py":
        program = ["python", script]
    words = [*program, *keep, f"hydra.run.dir={run_dir.resolve()}", "checkpoint.resume=auto"]
    return " ".join(shlex.quote(word) for word in words)


class RunCheckpointer:
    def __init__(self, run_dir: Path, *, every_n_steps: int, keep_last: int, extra_signal: str | None, dist: DistEnv, config: dict[str, Any]):
        self.run_dir = run_dir
        self.every_n_steps = every_n_steps
        self.dist = dist
        self.config = config
        self.store = CheckpointStore(run_dir / "checkpoints", keep_last)
        self.signals = StopSignals(extra_signal)
        self.parts: Restorable | None = None
        self.boundary_rng: dict[str, Any] | None = None
        self.resumed_from: Path | None = None
        self.last_saved: Path | None = None

    def start(self, parts: Restorable) -> None:
        self.parts = parts
        self.signals.install()

    def close(self) -> None:
        self.signals.uninstall()

    # ------------------------------------------------------------------ stopping
    def stop_requested_in_window(self) -> bool:
        # Under DDP one rank cannot abandon a window alone: the others would wait in
        # its all-reduce forever. Ranks agree at the step boundary instead.
        return self.signals.requested and not self.dist.is_distributed

    def stop_agreed(self) -> bool:
        """At a step boundary: did any rank receive a stop signal?"""
        if not self.dist.is_distributed or not torch_dist.is_initialized():
            return self.signals.requested
        flag = torch.tensor([self.signals.received or 0], dtype=torch.int64)
        if torch_dist.get_backend() == "nccl":
            flag = flag.cuda()
        torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MAX)
        signum = int(flag.item())
        if signum:
            self.signals.request(signum)
        return bool(signum)

    # ------------------------------------------------------------------- saving
    def mark_boundary(self) -> None:
        """The RNG state at a step boundary: what a resumed run must start from, even
        when the stop comes halfway through the next window."""
        self.boundary_rng = rng.capture()

    def due(self, step: int) -> bool:
        return bool(self.every_n_steps) and step % self.every_n_steps == 0

    def save(self, progress: dict[str, Any]) -> Path | None:
        """Rank 0 writes; every rank waits for it, so no rank runs ahead of a checkpoint."""
        assert self.parts is not None
        step = self.parts.run_state.step
        if self.last_saved is not None and self.last_saved.name == f"step_{step:08d}":
            return self.last_saved  # e.g. the final checkpoint at a periodic step
        path = None
        if self.dist.is_main:
            started = time.perf_counter()
            state = build_state(self.parts, rng_state=self.boundary_rng or rng.capture(), config=self.config, progress=progress)
            path = self.store.save(state, step)
            log.info("checkpoint %s (%.2f s)", path.relative_to(self.run_dir), time.perf_counter() - started)
        if self.dist.is_distributed and torch_dist.is_initialized():
            torch_dist.barrier()
        self.last_saved = path or self.store.directory / f"step_{step:08d}"
        return self.last_saved

    # ------------------------------------------------------------------ resuming
    def resume(self, resume: str) -> dict[str, Any] | None:
        """Load the chosen checkpoint into the live objects; return its progress record."""
        assert self.parts is not None
        path = choose_checkpoint(resume, self.store)
        if path is None:
            if resume == "auto":
                log.info("no checkpoint in %s: starting fresh", self.store.directory)
            return None
        if self.dist.is_main and resume not in ("auto", "none"):
            set_aside_newer(self.store, path)
        state = self.store.load(path)
        check_model_fits(unwrap(self.parts.model), state["model"], path)
        apply_state(self.parts, state)
        changes = config_changes(state.get("config") or {}, self.config)
        log_config_changes(changes)
        old_lr, new_lr = changes.get("optimizer.lr", (None, None))
        apply_lr_change(self.parts.optimizer, self.parts.scheduler, old_lr, new_lr)
        if self.parts.scheduler is not None:
            refresh_schedule(self.parts.optimizer, self.parts.scheduler)
        self.boundary_rng = rng.from_checkpoint(state["rng"])
        rng.restore(self.boundary_rng)
        self.resumed_from = path
        position = state["data_position"]
        log.info(
            "resumed from %s: step %d, epoch %d, %d samples into the epoch",
            path,
            self.parts.run_state.step,
            position["epoch"],
            position["samples_consumed"],
        )
        return state.get("progress") or {}
