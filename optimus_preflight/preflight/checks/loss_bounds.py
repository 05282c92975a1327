"""A loss with no lower bound (``step.loss_bounds``).

``LOSS_UNBOUNDED_BELOW``: a loss the model can drive to minus infinity by moving all its
predictions one way. A pinball (quantile) loss given its quantile in percent, q=90 for
P90 (``max(q * e, (q - 1) * e)`` is then negative for every over-prediction and falls
without limit), a sign flipped in a hand-written loss, a log-likelihood whose variance the
model controls without a floor. Training then "improves" forever by running the outputs
off to infinity: the loss curve looks like learning.

Measured with the model in eval mode: ``compute_loss`` runs with the model's floating
outputs shifted by a constant (10 and 1000 times their spread, both signs). A bounded loss
grows or flattens; one that goes negative and keeps falling as fast as the shift grows (ten
times more between the two shifts than before the first) has no minimum.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.eval_forward import eval_loss
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import map_batch, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SHIFTS = (10.0, 1000.0)  # in units of the outputs' spread
FALL = 10.0  # from the small to the large shift the loss falls this many times more than before it


def shifted_loss(ctx: PreflightContext, batch: Any, shift: float) -> float | None:
    """The scalar loss with every floating output of the model moved by ``shift`` times its spread."""

    def move(module: torch.nn.Module, args: Any, output: Any) -> Any:
        def one(value: Any) -> Any:
            # Predictions only: a 0-dim tensor is a loss the model computed itself (a Hugging Face output's .loss).
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() >= 1 and value.numel() > 1:
                spread = float(value.detach().float().std())
                return value + shift * (spread if spread > 0 else 1.0)
            return value
        return map_batch(one, output)

    handle = ctx.model.register_forward_hook(move) if shift else None
    try:
        return eval_loss(ctx, batch)
    finally:
        if handle is not None:
            handle.remove()


class LossBoundsCheck(Check):
    """LOSS_UNBOUNDED_BELOW: shifting the predictions drives the loss to minus infinity."""

    name = "step.loss_bounds"
    stage = Stage.STEP
    codes = ("LOSS_UNBOUNDED_BELOW",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        try:
            base = shifted_loss(ctx, batch, 0.0)
            if base is None:
                findings.data["summary"] = "no scalar loss"
                return
            found = {sign * shift: shifted_loss(ctx, batch, sign * shift) for shift in SHIFTS for sign in (1, -1)}
        except Exception:
            findings.data["summary"] = "the loss could not be computed on shifted outputs"
            return
        findings.data.update(loss=base, shifted={f"{shift:g}": value for shift, value in found.items()})
        findings.data["summary"] = f"loss {base:.4g}; at the largest shifts {found[SHIFTS[-1]]}, {found[-SHIFTS[-1]]}"
        for sign in (1, -1):
            near, far = found.get(sign * SHIFTS[0]), found.get(sign * SHIFTS[-1])
            if near is None or far is None or not (far < 0 and far < near) \
                    or near - far < FALL * max(base - near, 0.0, 1e-6 * abs(base)):
                continue
            direction = "up" if sign > 0 else "down"
            findings.error(
                "LOSS_UNBOUNDED_BELOW",
                f"the loss has no lower bound: moving every prediction {direction} (eval mode) takes it from {base:.4g} "
                f"to {near:.4g} and then {far:.4g}, so training can lower it forever by running the outputs off to "
                "infinity. A pinball (quantile) loss given its quantile in percent (q=90 for P90: max(q * e, "
                "(q - 1) * e) is negative and unbounded for every over-prediction), or a sign flipped in a "
                "hand-written loss, does this",
                "Give the quantile as a fraction in (0, 1) (q=0.9 for P90) and check the loss's sign: a loss must have "
                "a minimum the model can reach (it is 0 for a perfect prediction in a pinball or squared loss).",
            )
            return
