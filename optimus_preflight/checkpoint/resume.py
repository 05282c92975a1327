"""Which checkpoint to resume from, whether it fits, and what changed since it was saved."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from optimus_preflight.checkpoint.checkpoint_state import qualified_name
from optimus_preflight.checkpoint.store import (
    MANIFEST_FILE,
    STATE_FILE,
    CheckpointCorrupt,
    CheckpointStore,
    load_state,
    read_manifest,
    verify,
)
from optimus_preflight.config.changes import EXPECTED_CHANGES
from optimus_preflight.errors import UserError

log = logging.getLogger("optimus_preflight")

# What a training checkpoint must hold to be resumed from (see state.build_state).
RESUME_KEYS = ("model", "optimizer", "run_state", "data_position", "rng")
# Keys whose change between a checkpoint and its resume is expected, not worth a warning.


_EXPECTED = ("a checkpoint directory (checkpoints/step_XXXXXXXX, holding manifest.json and state.pt), "
             "its state.pt, or a run directory whose checkpoints/ holds one")
# What a run directory holds even when it never saved a checkpoint.
_RUN_DIR_MARKERS = ("checkpoints", ".hydra", "summary.json", "train.log", "metrics.jsonl")


def _is_checkpoint_dir(path: Path) -> bool:
    return (path / MANIFEST_FILE).exists() or (path / STATE_FILE).exists()


def _resume_error(value: str, what: str, fix: str) -> UserError:
    return UserError(f"checkpoint.resume={value!r} {what}; expected {_EXPECTED}", key="checkpoint.resume", fix=fix)


def explicit_checkpoint_dir(value: str) -> Path:
    """``checkpoint.resume=<path>``: a checkpoint dir, its state.pt, or a run dir.

    Checks the shape only (which files are there), so it is cheap enough to run before
    any work; a run dir stays a run dir here, its checkpoint is picked at load time.
    """
    path = Path(value).expanduser()
    if not path.exists():
        raise _resume_error(value, "does not exist",
                            "Give an existing path; checkpoint.resume=auto picks the newest checkpoint of this run dir, none starts fresh.")
    if path.is_file():
        if path.name != STATE_FILE:
            raise _resume_error(value, "is a file, not a checkpoint", f"Give the checkpoint's directory or its {STATE_FILE}.")
        path = path.parent
    if _is_checkpoint_dir(path):
        return path  # its contents are verified when it is loaded
    if any((path / marker).exists() for marker in _RUN_DIR_MARKERS):
        if not CheckpointStore(path / "checkpoints").candidates():
            raise _resume_error(
                value, f"is a run directory that holds no checkpoint (nothing under {path / 'checkpoints'})",
                "That run stopped before its first save (its summary.json and train.log say why). Point "
                "checkpoint.resume at a run that saved one, or start fresh with checkpoint.resume=none.")
        return path
    raise _resume_error(value, "is a directory that is neither a checkpoint nor a run directory",
                        "Point checkpoint.resume at checkpoints/step_XXXXXXXX inside a run directory, or at the run directory.")


def checkpoint_to_load(value: str) -> Path:
    """The checkpoint directory ``checkpoint.resume=<path>`` names; for a run dir, its
    newest checkpoint that verifies."""
    path = explicit_checkpoint_dir(value)
    if _is_checkpoint_dir(path):
        return path
    store = CheckpointStore(path / "checkpoints")
    ref, skipped = store.latest_valid()
    if ref is None:
        raise UserError(
            f"checkpoint.resume={value!r}: none of the {len(skipped)} checkpoint(s) in {store.directory} verifies "
            f"({skipped[0][0].name}: {skipped[0][1]})",
            key="checkpoint.resume",
            fix="Point checkpoint.resume at a good checkpoints/step_XXXXXXXX directory, or use checkpoint.resume=none to start fresh.",
        )
    return ref.path


def check_resume_value(value: str) -> None:
    """Validation before any work: an explicit path must name a checkpoint or a run dir
    that has one (the contents are verified at load)."""
    if value not in ("auto", "none"):
        explicit_checkpoint_dir(value)


@dataclass
class ResumePoint:
    """A checkpoint chosen and loaded (nothing on disk changed yet)."""

    path: Path
    state: dict[str, Any]
    explicit: bool
    # Newer checkpoints of the store that failed to verify or load (auto), with why.
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def refuse_to_start_over(value: str, store: CheckpointStore) -> None:
    """``checkpoint.resume=none`` in a run dir that holds checkpoints would interleave two
    runs' checkpoints (retention, ``latest`` and ``auto`` cannot tell them apart): refused."""
    refs = store.candidates()
    if value != "none" or not refs:
        return
    raise UserError(
        f"checkpoint.resume=none, but {store.directory} holds {len(refs)} checkpoint(s) of an earlier run "
        f"(newest: {refs[0].path.name}); starting over there would mix two runs' checkpoints",
        key="checkpoint.resume",
        fix="Continue that run with checkpoint.resume=auto; or start the new run in another directory "
        "(hydra.run.dir=...); or move that checkpoints directory aside yourself first.",
    )


def pick_resume_point(value: str, store: CheckpointStore) -> ResumePoint | None:
    """The checkpoint ``checkpoint.resume`` names, verified and loaded; None to start fresh.

    auto: the newest that verifies and loads (newer damaged ones are skipped with a
    warning); if the run dir has checkpoints and none of them can be used, that is an
    error, not a silent fresh start over them. A path: it must verify and load (exit 2).
    """
    if value == "none":
        return None
    if value == "auto":
        skipped: list[tuple[Path, str]] = []
        owner = run_owner(store)
        for ref in store.candidates():
            try:
                state = store.load(ref.path, RESUME_KEYS)
                foreign = not_this_runs(ref.path, ref.step, state, owner)
                if foreign:
                    raise CheckpointCorrupt(foreign)
            except CheckpointCorrupt as error:
                log.warning("skipping checkpoint %s: %s", ref.path, error)
                skipped.append((ref.path, str(error)))
                continue
            return ResumePoint(ref.path, state, explicit=False, skipped=skipped)
        if skipped:
            raise UserError(
                f"checkpoint.resume=auto: none of the {len(skipped)} checkpoint(s) in {store.directory} can be resumed "
                f"from ({skipped[0][0].name}: {skipped[0][1]})",
                key="checkpoint.resume",
                fix="Resume from a good copy with checkpoint.resume=<path>; or move that checkpoints directory aside to "
                "start this run over; or use a new hydra.run.dir.",
            )
        return None
    path = checkpoint_to_load(value)
    try:
        verify(path)
        state = load_state(path, RESUME_KEYS)
    except CheckpointCorrupt as error:
        raise UserError(
            f"checkpoint.resume={value!r} is not a usable checkpoint: {error}",
            key="checkpoint.resume",
            fix="Resume from an earlier checkpoint (see checkpoints/ in the run dir), or set checkpoint.resume=none.",
        ) from None
    if path.parent.resolve() != store.directory.resolve():
        manifest = _manifest(path) or {}
        log.warning("resuming from another run's checkpoint: %s (run %s, step %s); this run continues its weights, "
                    "optimizer and data position", path, manifest.get("run_id", "unknown"), manifest.get("step", "unknown"))
    return ResumePoint(path, state, explicit=True)


def _manifest(path: Path) -> dict[str, Any] | None:
    try:
        return read_manifest(path)
    except CheckpointCorrupt:
        return None


def run_owner(store: CheckpointStore) -> str | None:
    """The run whose checkpoints these are: the run id most of them carry (a tie goes to
    the one of the oldest). A checkpoint copied in from another run is then foreign."""
    ids = [manifest.get("run_id") for ref in reversed(store.candidates()) if (manifest := _manifest(ref.path))]
    ids = [run_id for run_id in ids if run_id]
    return max(dict.fromkeys(ids), key=ids.count) if ids else None


def not_this_runs(path: Path, step: int, state: dict[str, Any], owner: str | None) -> str | None:
    """Why the checkpoint at ``path`` (named for ``step``) is not this run's, or None:
    another run's id, or a step that disagrees with its name (a renamed copy)."""
    manifest = _manifest(path) or {}
    run_id = manifest.get("run_id")
    if owner and run_id and run_id != owner:
        return f"it was written by another run (run id {run_id}, this run's is {owner}): a copy that does not belong here"
    saved_step = (state.get("run_state") or {}).get("step")
    for what, value in (("its manifest", manifest.get("step")), ("its state", saved_step)):
        if value is not None and int(value) != step:
            return f"{what} says step {value} but its name says step {step}: a renamed or copied checkpoint"
    return None


def settle_resume(store: CheckpointStore, point: ResumePoint) -> None:
    """Once the run is known to be valid: move the store's checkpoints that are newer
    than the resume point out of the way (never deleted), so ``auto``, ``latest`` and
    retention follow the resumed timeline. Newer ones an explicit resume passed over
    start another timeline; newer ones ``auto`` skipped are damaged."""
    step = int(point.state["run_state"].get("step", 0))
    newer = [ref.path for ref in store.candidates() if ref.step > step and ref.path.resolve() != point.path.resolve()]
    aside = store.set_aside(newer, "damaged" if not point.explicit else "superseded")
    if aside is not None:
        log.warning("resuming from step %d: moved %d newer checkpoint(s) to %s", step, len(newer), aside)


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
        fix="Resume with the model config the checkpoint was trained with, or start a new run in a new "
        "hydra.run.dir.",
    )


def check_optimizer_fits(optimizer: torch.optim.Optimizer, state: dict[str, Any], checkpoint: Path) -> None:
    """The checkpoint's optimizer state must be for this optimizer class and these
    parameter groups; loading AdamW moments into SGD would 'work' and mistrain."""
    saved_class = state.get("optimizer_class")  # absent in checkpoints from before it was recorded
    current = qualified_name(type(optimizer))
    # A sharded checkpoint's groups are checked by DCP's load, which names what is missing.
    saved_groups = [len(group.get("params", [])) for group in state["optimizer"].get("param_groups", [])] if "optimizer" in state else None
    groups = [len(group["params"]) for group in optimizer.param_groups]
    problem = None
    if saved_class and saved_class != current:
        problem = f"it holds {saved_class} state and this run builds {current}"
    elif saved_groups is not None and saved_groups != groups:
        problem = f"its parameter groups hold {saved_groups} tensors and this optimizer's hold {groups}"
    if problem:
        raise UserError(
            f"checkpoint {checkpoint} does not fit the optimizer: {problem}",
            key="optimizer",
            fix="Resume with the optimizer settings the checkpoint was trained with, or start a new run in a new "
            "hydra.run.dir.",
        )


# Changes on resume that alter what the run trains (the batches, their weighting, the
# numerics, the random streams, the model): a WARNING, the rest an INFO line.
TRAINING_CHANGES = ("data.batch_size", "trainer.accumulation_steps", "trainer.precision", "trainer.seed", "model.",
                    "data.train", "optimizer._target_")


def training_changes(changes: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    return {key: value for key, value in changes.items() if key.startswith(TRAINING_CHANGES)}


def log_config_changes(changes: dict[str, tuple[Any, Any]], *, allowed: bool = True) -> None:
    """``allowed=False`` (checkpoint.allow_config_change=false): a change that alters
    training is a UserError naming each key, before anything on disk changes."""
    altering = training_changes(changes)
    if altering and not allowed:
        listed = "; ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in altering.items())
        raise UserError(f"the config changed since the checkpoint in ways that change training ({listed}), and "
                        "checkpoint.allow_config_change=false", key="checkpoint.allow_config_change",
                        fix="Resume with the checkpoint's values, set checkpoint.allow_config_change=true to accept "
                        "the change, or start a new run in a new hydra.run.dir.")
    if altering:
        log.warning("the config changed since the checkpoint in ways that change training: %s",
                    "; ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in altering.items()))
    for key, (old, new) in changes.items():
        if key.startswith(EXPECTED_CHANGES) or key in altering:
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
