"""A forecaster whose output cannot follow the level of its input (``step.level_invariance``).

Instance normalisation of each window (RevIN, ``(x - x.mean()) / x.std()`` inside ``forward``)
removes the window's level so the network sees shapes only; the forecast must be put back on
the window's scale at the end (``out * std + mean``). Without that inverse the model's output
is the same whatever level the window sits at, while the targets move with it: the loss can
only be lowered towards the average level, and every series is forecast at it.

Read from the model: the first batch's float windows ``(B, L)`` (or ``(B, L, F)``) shifted by a
constant three times their spread leave every output unchanged, while the samples' outputs
differ from each other and the float targets follow the windows' levels (their means correlate
0.9 or more across samples, and differ between samples more than within them); and the loss
changes when windows and targets are shifted together. A loss that normalises the targets with
the windows' own statistics (the model fed normalised windows, on purpose) is unchanged by that
shift and stays quiet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.eval_forward import eval_loss, model_outputs
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import map_batch, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_SAMPLES, MIN_LENGTH = 8, 4
SHIFT = 3.0  # times the windows' spread
UNMOVED = 1e-3  # of the shift: an output this still ignores it
LOSS_CHANGED = 0.1  # relative change of the loss when windows and targets move together
TRACKS = 0.9  # correlation of the targets' level with the windows'


def windows_and_targets(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    if not isinstance(batch, (list, tuple)) or len(batch) < 2:
        return None
    x, y = batch[0], batch[-1]
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or not x.is_floating_point() \
            or not y.is_floating_point() or x.dim() not in (2, 3) or len(x) < MIN_SAMPLES or len(y) != len(x) \
            or x.shape[1] < MIN_LENGTH:
        return None
    return x, y


def level_tracking(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Correlation across samples of the targets' mean with the windows' mean, when the targets'
    levels differ between samples more than their values within one; None otherwise."""
    window_level = x.detach().double().reshape(len(x), -1).mean(1)
    targets = y.detach().double().reshape(len(y), -1)
    target_level = targets.mean(1)
    within = float(targets.std(1).mean()) if targets.shape[1] > 1 else 0.0
    if float(target_level.std()) <= within or float(window_level.std()) == 0:
        return None
    return float(torch.corrcoef(torch.stack([window_level, target_level]))[0, 1])


class LevelInvarianceCheck(Check):
    """OUTPUT_IGNORES_LEVEL: outputs unchanged by the windows' level while the targets follow it."""

    name = "step.level_invariance"
    stage = Stage.STEP
    codes = ("OUTPUT_IGNORES_LEVEL",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        found = windows_and_targets(batch)
        tracking = level_tracking(*found) if found is not None else None
        if found is None or tracking is None or tracking < TRACKS:
            findings.data["summary"] = "no float windows whose targets follow their level"
            return
        x, y = found
        shift = SHIFT * float(x.detach().float().std())
        try:
            before = model_outputs(ctx, batch)
            after = model_outputs(ctx, map_batch(lambda value: value + shift if value is x else value, batch))
            loss = eval_loss(ctx, batch)
            moved_loss = eval_loss(ctx, map_batch(lambda value: value + shift if value is x or value is y else value,
                                                  batch))
        except Exception:
            findings.data["summary"] = "the model could not be run on shifted windows"
            return
        if not before or not after or len(before) != len(after) or before[0].shape != after[0].shape \
                or not before[0].is_floating_point() or before[0].shape[0] != len(x):
            findings.data["summary"] = "no per-sample output"
            return
        out0, out1 = before[0].float(), after[0].float()
        moved = float((out1 - out0).abs().max())
        differ = float((out0 - out0[:1]).abs().max()) > UNMOVED * shift
        findings.data.update(level_correlation=round(tracking, 4), output_moved=moved, shift=shift)
        findings.data["summary"] = f"outputs moved {moved:.3g} under a shift of {shift:.3g}"
        if moved > UNMOVED * shift or not differ or loss is None or moved_loss is None \
                or abs(moved_loss - loss) <= LOSS_CHANGED * max(abs(loss), 1e-12):
            return
        findings.warning(
            "OUTPUT_IGNORES_LEVEL",
            f"adding {shift:.3g} to every value of the {tuple(x.shape)} input windows leaves the model's outputs "
            f"unchanged (they move by {moved:.2g}), while the targets follow the windows' level (correlation "
            f"{tracking:.2f} across the batch's samples): the model normalises each window by its own mean and std "
            "(RevIN, an instance normalisation in forward) and returns the forecast without the inverse (out * std + "
            "mean), so the output cannot reach any series' level and is pulled to the average one",
            "Put the forecast back on the window's scale at the end of forward: mu, sd = x.mean(1, keepdim=True), "
            "x.std(1, keepdim=True) + eps; x = (x - mu) / sd; ...; return out * sd + mu (RevIN's denormalisation).",
        )
