"""Periodic fields convolved with zero padding (``data.periodic_padding``).

A surrogate on a periodic domain (a ring, a torus, longitude) must see the field wrap around:
the point left of the first is the last. A Conv1d/Conv2d with ``padding_mode='zeros'`` (the
default) puts a wall of zeros there instead, so the outputs near both ends are computed from
a field that does not exist, and the error concentrates at the edges.

Read from the first batch and the model: float fields ``(B, C, L)`` (or ``(B, C, H, W)``,
each spatial axis alone) that are smooth (the mean step between neighbours well under the
field's spread) and whose wrap-around step (last to first) is no larger than a step between
neighbours, with ends that vary like the field (not a blank border), in the inputs and in
targets of the same layout alike; and convolutions that pad with zeros. Natural signals and
images are not periodic: their two ends are unrelated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_POINTS = 16  # along the axis
SMOOTH = 0.3  # mean neighbour step under this share of the field's spread
WRAP = 2.0  # the wrap-around step at most this many neighbour steps
EDGE_SPREAD = 0.5  # of the field's spread, held by the values at each end


def periodic_axes(field: torch.Tensor, smooth: bool = True) -> list[int]:
    """The spatial axes (2 and on) along which a float field wraps around as smoothly as it steps
    (and, with ``smooth``, steps well under its spread: a field, not noise)."""
    found = []
    values = field.detach().double()
    for axis in range(2, values.dim()):
        if values.shape[axis] < MIN_POINTS:
            continue
        steps = values.diff(dim=axis).abs().mean()
        spread = values.std(dim=axis).mean()  # within each field along the axis, not between samples
        first, last = values.narrow(axis, 0, 1), values.narrow(axis, values.shape[axis] - 1, 1)
        wrap = (first - last).abs().mean()
        # Ends that vary like the field: a blank border (a blob drawn on zeros) matches itself trivially.
        varied = first.std() >= EDGE_SPREAD * spread and last.std() >= EDGE_SPREAD * spread
        if spread > 0 and steps > 0 and varied and (not smooth or steps <= SMOOTH * spread) and wrap <= WRAP * steps:
            found.append(axis)
    return found


def zero_padded_convs(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, (nn.Conv1d, nn.Conv2d))
            and module.padding_mode == "zeros" and (module.padding == "same" or any(
                p > 0 for p in (module.padding if isinstance(module.padding, tuple) else ())))]


class PeriodicPaddingCheck(Check):
    """PERIODIC_FIELD_ZERO_PADDED: periodic inputs and targets convolved with zero padding."""

    name = "data.periodic_padding"
    stage = Stage.DATA
    codes = ("PERIODIC_FIELD_ZERO_PADDED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch: Any = ctx.artifacts.first_batch
        convs = zero_padded_convs(ctx.model)
        if not convs or not isinstance(batch, (list, tuple)) or not batch or not isinstance(batch[0], torch.Tensor):
            findings.data["summary"] = "no zero-padded convolution over a (B, C, ...) field"
            return
        x = batch[0]
        if not x.is_floating_point() or x.dim() not in (3, 4) or len(x) < 2:
            findings.data["summary"] = "no (B, C, L) or (B, C, H, W) float input"
            return
        axes = periodic_axes(x)
        targets = [t for t in batch[1:] if isinstance(t, torch.Tensor) and t.is_floating_point()
                   and t.dim() == x.dim() and t.shape[2:] == x.shape[2:]]
        if targets:
            axes = [axis for axis in axes if axis in periodic_axes(targets[0], smooth=False)]
        findings.data["summary"] = f"{len(axes)} periodic axis(es) in the input"
        if not axes:
            return
        shown = ", ".join(convs[:3]) + (f" and {len(convs) - 3} more" if len(convs) > 3 else "")
        findings.warning(
            "PERIODIC_FIELD_ZERO_PADDED",
            f"the {tuple(x.shape)} input fields are periodic along dim {', '.join(str(a) for a in axes)}: every sample "
            "is smooth and steps from its last point back to its first no more than between neighbours"
            + (", and the targets wrap around alike" if targets else "")
            + f", but the convolutions {shown} pad with zeros (padding_mode='zeros', the default): the points near "
            "both ends see a wall of zeros instead of the field wrapped around, so a periodic domain is learned as "
            "one with walls and the error gathers at the edges",
            "Pad periodically: nn.Conv1d(..., padding=k // 2, padding_mode='circular') (likewise Conv2d), or "
            "F.pad(x, (p, p), mode='circular') before convolutions with padding=0.",
        )
