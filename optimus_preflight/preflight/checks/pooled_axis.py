"""A model that pools away the axis its labels live on (``step.pooled_axis``).

A clip classifier that averages its ``(N, n_mels, frames)`` log-mel input with ``x.mean(dim=1)``
(the mel bins) where ``dim=2`` (time) was meant keeps every shape right on square crops, and
the frequency band that names the class is averaged away: the model trains to chance.

Read from the first batch of ``(x, labels)`` with a float ``(B, A, C)`` input: the output stays
the same when one axis's entries are shuffled (one order for every sample), so the model pools
over that axis first. Then, on up to 1024 training samples, the labels measured against the
input averaged over that axis (what the model keeps) and over the other one
(``analyses.label_signal``): at chance for the first while the second predicts them is the
finding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.eval_forward import model_outputs
from optimus_preflight.preflight.analyses.label_signal import label_signal
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_SIDE = 4
SAMPLES, BUDGET_S = 1024, 2.0
SAME = 1e-4  # of the outputs' scale


def _pair(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    if not isinstance(batch, (list, tuple)) or len(batch) != 2:
        return None
    x, y = batch
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or not x.is_floating_point() \
            or x.dim() != 3 or min(x.shape[1:]) < MIN_SIDE or y.dim() != 1 or y.is_floating_point() \
            or y.dtype == torch.bool or len(y) != len(x):
        return None
    return x, y


def _shuffled(batch: Any, axis: int) -> Any:
    x, y = batch
    order = torch.randperm(x.shape[axis], generator=torch.Generator().manual_seed(axis))
    return type(batch)((x.index_select(axis, order.to(x.device)), y)) if isinstance(batch, tuple) \
        else [x.index_select(axis, order.to(x.device)), y]


def pooled_axis(ctx: PreflightContext, batch: Any) -> int | None:
    """The one input axis (1 or 2) the model's output ignores the order of, or None."""
    base = model_outputs(ctx, batch)
    if not base or len(base) != 1:
        return None
    scale = float(base[0].abs().max().clamp_min(1e-6))
    invariant = []
    for axis in (1, 2):
        moved = model_outputs(ctx, _shuffled(batch, axis))
        if not moved or moved[0].shape != base[0].shape:
            return None
        invariant.append(float((moved[0] - base[0]).abs().max()) <= SAME * scale)
    return (1 if invariant[0] else 2) if invariant.count(True) == 1 else None


class PooledAxisCheck(Check):
    """POOLED_AXIS_CARRIES_LABEL: the model averages away the axis the labels depend on."""

    name = "step.pooled_axis"
    stage = Stage.STEP
    codes = ("POOLED_AXIS_CARRIES_LABEL",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no (B, A, C) float input beside class labels"
        if _pair(ctx.artifacts.first_batch) is None:
            return
        try:
            axis = pooled_axis(ctx, move_to_device(ctx.artifacts.first_batch, ctx.device))
        except Exception:
            return
        findings.data["summary"] = "the model's output follows the order along both axes" if axis is None \
            else f"the model pools over input dim {axis}"
        if axis is None:
            return
        other = 3 - axis

        def means(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
            pair = _pair(batch)
            if pair is None:
                return None
            x, y = pair
            return x.detach().float().mean(axis).cpu(), x.detach().float().mean(other).cpu(), y.detach().cpu()

        parts = read_samples(ctx, self.name, findings, ctx.train_loader, f"training samples for {self.name}", means,
                             SAMPLES, BUDGET_S)
        if not parts:
            return
        labels = torch.cat([y for _, _, y in parts])
        kept = label_signal(torch.cat([k for k, _, _ in parts]), labels)
        lost = label_signal(torch.cat([o for _, o, _ in parts]), labels)
        if kept is None or lost is None or not kept.unrelated or lost.unrelated:
            return
        x = ctx.artifacts.first_batch[0]
        findings.warning(
            "POOLED_AXIS_CARRIES_LABEL",
            f"the model pools its {tuple(x.shape)} input over dim {axis} first (its output does not change when that "
            f"axis's entries are shuffled), and averaged over dim {axis} the input says nothing about the labels "
            f"({kept.samples} training samples: 5-NN {kept.neighbour_accuracy:.0%}, linear "
            f"{kept.linear_accuracy:.0%}, majority {kept.majority:.0%}), while averaged over dim {other} it predicts "
            f"them ({max(lost.neighbour_accuracy, lost.linear_accuracy):.0%}): the pooling averages away the axis "
            f"that carries the class, and the model trains to chance. A (N, n_mels, frames) spectrogram pooled with "
            f"x.mean(dim=1), over the mel bins, where time (dim=2) was meant does this; square inputs keep the next "
            "layer's size right",
            f"Pool over the other axis: x.mean(dim={other}) (or max/sum over dim {other}), keeping dim {axis}, "
            "the one the labels depend on.",
        )
