"""Next-token targets shifted the wrong way (``data.shift_direction``).

A language model or any autoregressive sequence model trains on ``inputs = seq[:, :-1]`` and
``targets = seq[:, 1:]``: at each position the target is the token that comes next. Swapping
the two slices (``seq[:, 1:], seq[:, :-1]``) or shifting the labels right instead of left keeps
every shape, dtype and vocabulary; the target at each position is then the token the model
read one step before, and a causal model learns to copy from its past while its next-token
predictions stay untrained.

Read from the first batch: two integer ``(B, T)`` tensors (inputs and targets, or a mapping's
``input_ids`` and ``labels``) where the target at position t equals the input at t - 1 in
nearly every position, while the next-token relation (the input at t + 1) does not hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_POSITIONS = 4
BACKWARD = 0.9  # share of positions whose target is the previous input token
FORWARD_AT_MOST = 0.5  # ... while this share at most has the next input token as its target


def sequences(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(inputs, targets): two integer (B, T) tensors of one shape, by key or by position."""
    if isinstance(batch, Mapping):
        pair = batch.get("input_ids"), batch.get("labels")
    elif isinstance(batch, (list, tuple)) and len(batch) == 2:
        pair = batch[0], batch[1]
    else:
        return None
    if not all(isinstance(t, torch.Tensor) and t.dim() == 2 and not t.is_floating_point() and t.dtype != torch.bool
               for t in pair) or pair[0].shape != pair[1].shape or pair[0].shape[1] < MIN_POSITIONS:
        return None
    return pair[0].detach().cpu(), pair[1].detach().cpu()


def backward_share(inputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    """(share of positions t >= 1 whose target is input t - 1, share whose target is input t + 1)."""
    kept = targets[:, 1:] != -100
    back = ((targets[:, 1:] == inputs[:, :-1]) & kept).sum() / kept.sum().clamp(min=1)
    ahead = targets[:, :-1] != -100
    forward = ((targets[:, :-1] == inputs[:, 1:]) & ahead).sum() / ahead.sum().clamp(min=1)
    return float(back), float(forward)


class ShiftDirectionCheck(Check):
    """TARGETS_SHIFTED_BACK: each target is the previous input token, not the next one."""

    name = "data.shift_direction"
    stage = Stage.DATA
    codes = ("TARGETS_SHIFTED_BACK",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        pair = sequences(ctx.artifacts.first_batch)
        if pair is None:
            findings.data["summary"] = "no pair of token sequences of one shape"
            return
        back, forward = backward_share(*pair)
        findings.data.update(previous_token_share=round(back, 4), next_token_share=round(forward, 4))
        findings.data["summary"] = f"targets: {back:.0%} the previous input token, {forward:.0%} the next"
        if back < BACKWARD or forward > FORWARD_AT_MOST:
            return
        findings.warning(
            "TARGETS_SHIFTED_BACK",
            f"the targets are the input sequence shifted the wrong way: at {back:.0%} of the positions the target is "
            f"the token the model read one step before (the previous token), and only at {forward:.0%} the next "
            "one. Slices swapped (inputs = seq[:, 1:], targets = seq[:, :-1]) or labels rolled right do this; a "
            "causal model then learns to copy its past and never to predict the next token",
            "Shift the targets left: inputs, targets = seq[:, :-1], seq[:, 1:] (the target at t is the token at t + 1).",
            "data.train",
        )
