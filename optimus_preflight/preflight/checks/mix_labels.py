"""Mixup / CutMix label weights that do not follow the mixed input (``step.mix_labels``).

``MIX_LABEL_WEIGHTS``: the loss function mixes each input with a partner from the batch
(``lam * x + (1 - lam) * x[perm]``, or a pasted box) and weighs the two labels by other
shares than the input holds: ``(1 - lam) * loss(y) + lam * loss(y[perm])``, or CutMix's
``lam`` left as the box's area. Each mixed sample is then trained mostly towards the label
of the sample it mostly is not; training still lowers the loss, and accuracy suffers.

Measured on a few train-mode loss calls on the first batch (``analyses/mix_labels.py``),
each drawing its own mixing coefficient; only calls whose input is clearly mostly one of the
two samples (share 0.35 from even) are judged, and every judged call must disagree.
Mixing done in the DataLoader (the batch already mixed) is outside what it can see.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.analyses.mix_labels import MixDraw, mix_draw
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import move_to_device
from optimus_preflight.training.step import split_loss_output

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

DRAWS = 6
INFORMATIVE = 0.15  # the input's share of x at least this far from 0.5
MISMATCH = 0.25  # the label's weight this far from the input's share
MIN_JUDGED = 2


class MixLabelsCheck(Check):
    """MIX_LABEL_WEIGHTS: mixed inputs whose two labels are weighted by other shares than the input holds."""

    name = "step.mix_labels"
    stage = Stage.STEP
    codes = ("MIX_LABEL_WEIGHTS",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no input mixed with a partner from the batch inside the loss"
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        draws: list[MixDraw] = []
        with preserved_training_state(ctx):
            ctx.model.train()
            for _ in range(DRAWS):
                with ctx.training.plan.autocast():
                    draw = mix_draw(ctx.model, batch, lambda: _loss(ctx, batch))
                if draw is None:
                    return
                draws.append(draw)
        judged = [d for d in draws if abs(d.input_share - 0.5) >= INFORMATIVE]
        findings.data.update(draws=[(round(d.input_share, 3), round(d.label_share, 3)) for d in draws])
        findings.data["summary"] = (f"inputs mixed in the loss: {len(judged)} of {len(draws)} draws judged, "
                                    "label weights against the input's share")
        if len(judged) < MIN_JUDGED or not all(abs(d.label_share - d.input_share) > MISMATCH for d in judged):
            return
        shown = min(judged, key=lambda d: abs(abs(d.input_share - 0.5) - 0.3))  # a readable draw, near 80 / 20
        swapped = all(abs(d.label_share - (1 - d.input_share)) <= 0.1 for d in judged)
        how = ("the two weights are swapped" if swapped else
               "the weights are not the input's shares")
        findings.warning(
            "MIX_LABEL_WEIGHTS",
            f"the loss function mixes each input with a partner from the batch (x[perm]) and weighs the two labels "
            f"by other shares than the input holds: in one call the model's input was {shown.input_share:.0%} sample "
            f"i and {1 - shown.input_share:.0%} its partner, while y_i weighed {shown.label_share:.0%} of the loss and "
            f"y[perm] {1 - shown.label_share:.0%} ({len(judged)} of {len(judged)} judged calls disagree; {how}). "
            "Each mixed sample is trained mostly towards the label of the sample it mostly is not",
            "Weigh each label by its sample's share of the input: for x_mix = lam * x + (1 - lam) * x[perm], loss = "
            "lam * criterion(out, y) + (1 - lam) * criterion(out, y[perm]); for CutMix, lam = 1 - box_area / "
            "image_area, computed from the box actually pasted.",
        )


def _loss(ctx: PreflightContext, batch: object) -> torch.Tensor:
    return split_loss_output(ctx.compute_loss(ctx.model, batch), batch)[0]
