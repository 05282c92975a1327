"""Which way a hand-written pairwise loss wants a pair's two scores to move.

A BPR or reward-model loss, ``-logsigmoid(s_pos - s_neg)``, has no torch criterion to read:
the model scores the two items of each pair (one call returning both, or one call per item)
and the loss takes their difference. The batch lists the pair's items in the dataset's order
((user, positive, negative), (chosen, rejected)). Read here from one eval-mode step:

- which batch tensor drives which score: each tensor's rows rolled by one, and the score that
  moves is the one it feeds (a user id moves both, an item id one);
- the loss's gradient with respect to each score, with the model's outputs replaced by leaves.

The loss ranks the first-listed item first when its gradient on that score is negative
(raising the score lowers the loss) and on the other positive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_ROWS = 8
MOVED = 1e-5  # of the scores' scale: a change this small is rounding


@dataclass
class ScorePair:
    first: str  # the batch entry listed first (index or key) and the one listed second
    second: str
    pushes_first_down: float  # share of rows whose loss falls as the first-listed item's score falls
    pushes_second_up: float


def _scores(output: Any, rows: int) -> list[torch.Tensor] | None:
    """The (B,) or (B, 1) float scores in one model output: the tensor itself or a 2-tuple's."""
    parts = list(output) if isinstance(output, (tuple, list)) else [output]
    found = [p for p in parts if isinstance(p, torch.Tensor) and p.is_floating_point()
             and p.shape[:1] == (rows,) and p.numel() == rows]
    return found if len(found) == len(parts) else None


def _entries(batch: Any) -> list[tuple[str, Any]] | None:
    if isinstance(batch, dict):
        return [(repr(key), key) for key in batch]
    if isinstance(batch, (list, tuple)):
        return [(str(index), index) for index in range(len(batch))]
    return None


def _replace(batch: Any, key: Any, value: torch.Tensor) -> Any:
    if isinstance(batch, dict):
        return {**batch, key: value}
    copy = list(batch)
    copy[key] = value
    return type(batch)(copy) if isinstance(batch, tuple) else copy


def _observed_scores(ctx: PreflightContext, batch: Any, rows: int) -> list[torch.Tensor] | None:
    calls: list[Any] = []
    handle = ctx.model.register_forward_hook(lambda module, args, output: calls.append(output))
    try:
        eval_forward(ctx, batch)
    except Exception:
        return None
    finally:
        handle.remove()
    found = [_scores(output, rows) for output in calls]
    if any(scores is None for scores in found):
        return None
    flat = [score.detach().reshape(-1).float() for scores in found for score in scores]  # type: ignore[union-attr]
    return flat if len(flat) == 2 else None


def _score_gradients(ctx: PreflightContext, batch: Any, rows: int) -> list[torch.Tensor] | None:
    """d loss / d score for the two scores, in the order the model produced them."""
    stand_ins: list[torch.Tensor] = []

    def swap(module: nn.Module, args: tuple, output: Any) -> Any:
        scores = _scores(output, rows)
        if scores is None:
            return output
        leaves = [score.detach().clone().requires_grad_(True) for score in scores]
        stand_ins.extend(leaves)
        return leaves[0] if isinstance(output, torch.Tensor) else type(output)(leaves)

    handle = ctx.model.register_forward_hook(swap)
    try:
        with preserved_training_state(ctx), torch.enable_grad():
            ctx.model.eval()
            with ctx.training.plan.autocast():
                result = ctx.compute_loss(ctx.model, move_to_device(batch, ctx.device))
            loss = result[0] if isinstance(result, tuple) else result
            if len(stand_ins) != 2 or not isinstance(loss, torch.Tensor) or loss.numel() != 1 \
                    or not loss.requires_grad:
                return None
            grads = torch.autograd.grad(loss, stand_ins, allow_unused=True)
    except Exception:
        return None
    finally:
        handle.remove()
    if any(grad is None for grad in grads):
        return None
    return [grad.detach().reshape(-1).float() for grad in grads]  # type: ignore[union-attr]


def score_pair(ctx: PreflightContext, batch: Any) -> ScorePair | None:
    """The pair of batch entries behind a step's two per-sample scores and which way the loss
    pushes each; None when the step does not look like that (one score, embeddings, a
    criterion of torch's own, distances that are never negative)."""
    entries = _entries(batch)
    tensors = [(name, key, batch[key]) for name, key in entries or []
               if isinstance(batch[key], torch.Tensor) and batch[key].dim() >= 1]
    rows = tensors[0][2].shape[0] if tensors else 0
    if rows < MIN_ROWS:
        return None
    base = _observed_scores(ctx, batch, rows)
    if base is None or (bool((base[0] >= 0).all()) and bool((base[1] >= 0).all())):
        return None  # distances (or probabilities): which way is better is not the sign of the gradient
    scale = max(float(base[0].abs().max()), float(base[1].abs().max()), 1e-6)
    drives: dict[int, tuple[str, Any]] = {}
    for name, key, tensor in tensors:
        if tensor.shape[0] != rows or bool((tensor == tensor[:1]).all()):
            continue
        moved = _observed_scores(ctx, _replace(batch, key, torch.roll(tensor, 1, 0)), rows)
        if moved is None:
            return None
        changed = [float((m - b).abs().max()) > MOVED * scale for m, b in zip(moved, base, strict=True)]
        if changed.count(True) == 1:
            drives.setdefault(changed.index(True), (name, key))
    if len(drives) != 2:
        return None
    grads = _score_gradients(ctx, batch, rows)
    if grads is None:
        return None
    order = sorted(drives, key=lambda score: [k for _, k, _ in tensors].index(drives[score][1]))
    first, second = order
    return ScorePair(drives[first][0], drives[second][0], float((grads[first] > 0).float().mean()),
                     float((grads[second] < 0).float().mean()))
