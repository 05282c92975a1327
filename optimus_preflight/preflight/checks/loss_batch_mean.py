"""A loss that sees the outputs only through their batch mean (``step.loss_batch_mean``).

``(pred - y).mean() ** 2`` squares the mean error instead of averaging squared errors:
positive and negative errors cancel inside the mean, so any predictions whose errors average
to zero cost nothing, and the gradient each sample's output gets is the same number for every
sample. The model learns the targets' batch mean and nothing per sample. ``(pred.mean() -
y.mean()) ** 2`` and ``abs(pred.sum() - y.sum())`` do the same.

Read from the loss on the first batch, with the model's output (one forward, one tensor of a
row per sample) swapped for a free tensor: the gradient of the loss with respect to it, at the
output and again at the output moved by noise far larger than the errors. When every row's
gradient is the same non-zero vector at both points while the batch's targets differ, the loss
depends on the outputs only through their sum. (An L1 or Smooth L1 loss whose errors all share
a sign at init, every prediction below its target, gives equal rows at the first point only.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.output_descent import FixedOutputs, scalar_loss
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_ROWS = 8
SAME = 1e-6  # rows' gradients equal to within this share of the largest
NOISE = 3.0  # the second point's noise, in units of the outputs' and targets' largest magnitudes


def varying_targets(batch: Any, rows: int) -> bool:
    """Whether an ``(inputs, targets)`` batch's targets have one row per sample and differ."""
    if not isinstance(batch, (list, tuple)) or len(batch) != 2 or not isinstance(batch[1], torch.Tensor):
        return False
    targets = batch[1]
    return targets.dim() >= 1 and len(targets) == rows and bool((targets != targets[:1]).any())


def output_gradients(ctx: PreflightContext, batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The loss's gradient with respect to the model's (B, ...) output on ``batch``, taken with
    the output as a free tensor, at the model's output and at that output moved by noise far
    larger than the errors (so errors of both signs occur: an L1 loss whose errors all share a
    sign at init gives every row the same gradient too, but only there); None when the model is
    called other than once, its output is not one float tensor, or the loss cannot be
    evaluated on it."""
    seen: list[Any] = []
    handle = ctx.model.register_forward_hook(lambda module, args, output: seen.append(output))
    try:
        with preserved_training_state(ctx), torch.no_grad():
            ctx.model.eval()
            ctx.compute_loss(ctx.model, batch)
    except Exception:  # noqa: BLE001 - a loss this probe cannot evaluate says nothing either way
        return None
    finally:
        handle.remove()
    output = seen[0] if len(seen) == 1 else None
    if not isinstance(output, torch.Tensor) or not output.is_floating_point() or output.dim() == 0:
        return None
    base = output.detach().float()
    targets = batch[1] if isinstance(batch, (list, tuple)) and len(batch) == 2 else None
    spread = float(base.abs().max()) + (float(targets.float().abs().max()) if isinstance(targets, torch.Tensor)
                                        and targets.numel() > 0 else 0.0)
    noise = torch.randn(base.shape, generator=torch.Generator().manual_seed(0)).to(base.device)
    gradients = []
    for point in (base, base + NOISE * (spread + 1e-3) * noise):
        free = point.clone().requires_grad_(True)
        stand_in = FixedOutputs(free)
        try:
            with torch.enable_grad(), torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                value = scalar_loss(ctx.compute_loss(stand_in, batch))
                if value is None or stand_in.calls != 1 or not torch.isfinite(value):
                    return None
                (gradient,) = torch.autograd.grad(value, [free], allow_unused=True)
        except Exception:  # noqa: BLE001 - a loss that needs more of the model than its output
            return None
        if gradient is None:
            return None
        gradients.append(gradient)
    return gradients[0], gradients[1]


def same_rows(gradient: torch.Tensor) -> bool:
    rows = gradient.reshape(len(gradient), -1)
    largest = float(rows.abs().max())
    return largest > 0 and float((rows - rows[:1]).abs().max()) <= SAME * largest


class LossBatchMeanCheck(Check):
    """LOSS_ONLY_BATCH_MEAN: every sample's output gets the same gradient, whatever its target."""

    name = "step.loss_batch_mean"
    stage = Stage.STEP
    codes = ("LOSS_ONLY_BATCH_MEAN",)
    requires = (FIRST_BATCH, FIRST_STEP)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        found = output_gradients(ctx, batch)
        if found is None or len(found[0]) < MIN_ROWS or not varying_targets(batch, len(found[0])):
            findings.data["summary"] = "not an (inputs, targets) batch through one model output"
            return
        gradient, moved = found
        rows = gradient.reshape(len(gradient), -1)
        findings.data["summary"] = ("every sample's output gets the same gradient" if same_rows(gradient) and
                                    same_rows(moved) else "the samples' outputs get their own gradients")
        if not (same_rows(gradient) and same_rows(moved)):
            return
        findings.warning(
            "LOSS_ONLY_BATCH_MEAN",
            f"the loss depends on the model's outputs only through their batch mean (or sum): on the first batch "
            f"each of the {len(rows)} samples' outputs gets the same gradient ({float(rows[0].flatten()[0]):.3g}), "
            "though their targets differ, so every step moves all predictions together and no sample is fitted on "
            "its own. (pred - y).mean() ** 2, the square of the mean error, does this: positive and negative errors "
            "cancel inside the mean before it is squared, and the model learns only the targets' batch mean",
            "Square (or take the absolute value of) each error before averaging: ((pred - y) ** 2).mean(), i.e. "
            "F.mse_loss(pred, y) (F.l1_loss for the absolute error).",
        )
