"""Episode-end flags the loss never reads (``step.transition_flags``).

``DONE_FLAGS_UNUSED``: a batch of transitions ``(state, ..., next_state, done)`` whose 0/1
``done`` field has no effect on the loss. A TD target written ``r + gamma * V(s')`` instead of
``r + gamma * (1 - done) * V(s')`` bootstraps through the end of every episode from the value
of a terminal state (which should be 0), and the values near the ends feed on themselves.

Read from the loss: with the model in eval mode, the first batch's loss is computed again with
the flags flipped (``1 - done``); a loss that reads them changes, one that ignores them does not.
A batch is read as transitions when it holds two float fields of one shape (a state and the
next state) beside a 0/1 field with both values present, or a mapping key that names one
(``done``, ``dones``, ``terminal``, ``terminated``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.eval_forward import eval_loss
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

FLAG_KEYS = ("done", "dones", "terminal", "terminals", "terminated", "is_terminal")
SAME = 1e-7  # relative change of the loss below this: the flags are not read


def _is_flags(value: Any, rows: int) -> bool:
    if not isinstance(value, torch.Tensor) or value.dim() not in (1, 2) or value.shape[0] != rows \
            or (value.dim() == 2 and value.shape[1] != 1):
        return False
    values = value.detach().float()
    return bool(((values == 0) | (values == 1)).all()) and 0 < float(values.mean()) < 1


def flag_field(batch: Any) -> Any | None:
    """The key or index of the done flags of a transition batch; None for other batches."""
    if isinstance(batch, Mapping):
        rows = next((v.shape[0] for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() >= 1), 0)
        return next((key for key in batch if str(key).lower() in FLAG_KEYS and _is_flags(batch[key], rows)), None)
    if not isinstance(batch, (tuple, list)) or len(batch) < 4:
        return None
    tensors = [value for value in batch if isinstance(value, torch.Tensor) and value.dim() >= 1]
    if len(tensors) != len(batch):
        return None
    rows = tensors[0].shape[0]
    shapes = [tuple(t.shape) for t in tensors if t.is_floating_point() and t.dim() >= 2]
    if not any(shapes.count(shape) >= 2 for shape in shapes):
        return None  # no (state, next state) pair
    flags = [index for index, value in enumerate(batch) if _is_flags(value, rows)]
    return flags[-1] if flags else None  # (s, a, r, s', done): binary actions and rewards come first


def flipped(batch: Any, field: Any) -> Any:
    if isinstance(batch, Mapping):
        return {**batch, field: 1 - batch[field]}
    out = list(batch)
    out[field] = 1 - batch[field]
    return type(batch)(out) if isinstance(batch, tuple) else out


class TransitionFlagsCheck(Check):
    """DONE_FLAGS_UNUSED: flipping the done flags leaves the loss unchanged."""

    name = "step.transition_flags"
    stage = Stage.STEP
    codes = ("DONE_FLAGS_UNUSED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "not a batch of transitions with done flags"
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        field = flag_field(batch)
        if field is None:
            return
        try:
            base, other = eval_loss(ctx, batch), eval_loss(ctx, flipped(batch, field))
        except Exception:
            findings.data["summary"] = "the loss could not be computed with the flags flipped"
            return
        if base is None or other is None:
            return
        change = abs(other - base) / max(abs(base), 1e-12)
        share = float(batch[field].float().mean())
        where = f"batch['{field}']" if isinstance(field, str) else f"batch[{field}]"
        findings.data.update(field=str(field), loss=base, loss_flags_flipped=other, share_done=round(share, 4))
        findings.data["summary"] = f"{where}: flipping the done flags moves the loss by {change:.2%}"
        if change > SAME:
            return
        findings.warning(
            "DONE_FLAGS_UNUSED",
            f"the batch holds transitions with episode-end flags ({where}, 0/1, {share:.0%} ones), but the loss ignores "
            f"them: flipping every flag leaves it at {base:.6g} (eval mode). A TD target written r + gamma * V(s') "
            "bootstraps through the end of every episode from the value of a terminal state, which should be 0, so "
            "the values near the ends feed on themselves and the whole value function drifts",
            "Mask the bootstrap at the ends of episodes: target = r + gamma * (1 - done) * V(s').detach() (for "
            "Q-learning, (1 - done) * max_a Q(s', a)); with time-limit truncations, mask only true terminations.",
            "model",
        )
