"""Which checkpoint to resume from, whether it fits, and what changed since it was saved."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from optimus_preflight.checkpoint.store import STATE_FILE, CheckpointCorrupt, CheckpointStore, verify
from optimus_preflight.errors import UserError

log = logging.getLogger("optimus_preflight")

# Keys whose change between a checkpoint and its resume is expected, not worth a warning.
_QUIET_KEYS = ("checkpoint.resume", "preflight.", "logging.")


def explicit_checkpoint_dir(value: str) -> Path:
    """``checkpoint.resume=<path>``: a checkpoint dir, its state.pt, or a run dir."""
    path = Path(value).expanduser()
    if path.name == STATE_FILE:
        path = path.parent
    if (path / "checkpoints").is_dir():
        ref, _ = CheckpointStore(path / "checkpoints").latest_valid()
        if ref is None:
            raise UserError(
                f"checkpoint.resume={value!r}: the run dir has no valid checkpoint",
                key="checkpoint.resume",
                fix="Point checkpoint.resume at a checkpoints/step_XXXXXXXX directory, or use checkpoint.resume=none to start fresh.",
            )
        return ref.path
    if not path.exists():
        raise UserError(
            f"checkpoint.resume={value!r} does not exist",
            key="checkpoint.resume",
            fix="Give the path of a checkpoints/step_XXXXXXXX directory (or its run dir); "
            "checkpoint.resume=auto picks the newest in this run dir, none starts fresh.",
        )
    return path


def check_resume_value(value: str) -> None:
    """Validation before any work: an explicit path must exist (contents are checked at load)."""
    if value not in ("auto", "none"):
        explicit_checkpoint_dir(value)


def choose_checkpoint(value: str, store: CheckpointStore) -> Path | None:
    if value == "none":
        return None
    if value == "auto":
        ref, skipped = store.latest_valid()
        for path, reason in skipped:
            log.warning("skipping checkpoint %s: %s", path, reason)
        return ref.path if ref else None
    path = explicit_checkpoint_dir(value)
    try:
        verify(path)
    except CheckpointCorrupt as error:
        raise UserError(
            f"checkpoint.resume={value!r} is not a usable checkpoint: {error}",
            key="checkpoint.resume",
            fix="Resume from an earlier checkpoint (see checkpoints/ in the run dir), or set checkpoint.resume=none.",
        ) from None
    return path


def set_aside_newer(store: CheckpointStore, resumed: Path) -> None:
    """Resuming from an older checkpoint of this run starts a new timeline; the newer
    checkpoints are moved aside (never deleted) so `auto` and pruning do not mix them."""
    try:
        resumed_step = next(ref.step for ref in store.candidates() if ref.path.resolve() == resumed.resolve())
    except StopIteration:
        return  # resumed from another run's checkpoint
    newer = [ref for ref in store.candidates() if ref.step > resumed_step]
    if not newer:
        return
    aside = store.directory / f"superseded-{time.strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir()
    for ref in newer:
        shutil.move(str(ref.path), aside / ref.path.name)
    log.warning("resuming from step %d: moved %d newer checkpoints to %s", resumed_step, len(newer), aside)


def check_model_fits(model: nn.Module, saved: dict[str, torch.Tensor], checkpoint: Path) -> None:
    current = model.state_dict()
    missing = sorted(set(current) - set(saved))
    unexpected = sorted(set(saved) - set(current))
    mismatched = [
        f"{name}: checkpoint {tuple(saved[name].shape)} vs model {tuple(current[name].shape)}"
        for name in current
        if name in saved and tuple(saved[name].shape) != tuple(current[name].shape)
    ]
    if not (missing or unexpected or mismatched):
        return
    details = mismatched[:3] + [f"missing in checkpoint: {n}" for n in missing[:3]] + [f"not in model: {n}" for n in unexpected[:3]]
    raise UserError(
        f"checkpoint {checkpoint} does not fit the model ({len(mismatched)} shape mismatches, "
        f"{len(missing)} missing, {len(unexpected)} unexpected tensors; " + "; ".join(details) + ")",
        key="model",
        fix="Resume with the model config the checkpoint was trained with, or set checkpoint.resume=none "
        "(or a fresh hydra.run.dir) to start a new run.",
    )


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        flat: dict[str, Any] = {}
        for key, value in tree.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: tree}


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    old, new = _flatten(saved), _flatten(current)
    return {key: (old.get(key), new.get(key)) for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)}


def log_config_changes(changes: dict[str, tuple[Any, Any]]) -> None:
    for key, (old, new) in changes.items():
        if key.startswith(_QUIET_KEYS):
            continue
        log.info("config changed since the checkpoint: %s %r -> %r", key, old, new)


def apply_lr_change(optimizer: torch.optim.Optimizer, scheduler: Any, old_lr: float | None, new_lr: float | None) -> None:
    """A new optimizer.lr rescales every group's base LR; the schedule keeps its position."""
    if not old_lr or not new_lr or old_lr == new_lr:
        return
    ratio = new_lr / old_lr
    for group in optimizer.param_groups:
        group["lr"] *= ratio
        if "initial_lr" in group:
            group["initial_lr"] *= ratio
    if scheduler is not None and hasattr(scheduler, "base_lrs"):
        scheduler.base_lrs = [lr * ratio for lr in scheduler.base_lrs]


def refresh_schedule(optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Recompute the current LR from the (config-built) schedule at the restored step."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if not lambdas:
        return
    for group, base_lr, fn in zip(optimizer.param_groups, scheduler.base_lrs, lambdas):
        group["lr"] = base_lr * fn(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
