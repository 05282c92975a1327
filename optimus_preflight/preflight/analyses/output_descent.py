"""What the loss asks of the outputs: gradient descent on the model's output itself.

The model's output on one batch (one eval forward) becomes a free tensor, a stand-in module
returns it to ``compute_loss`` in the model's place, and a few dozen Adam steps lower the loss
through that tensor alone (the model is neither run again nor touched). Whatever the
loss rewards, the descended output shows it. For class labels, a loss that is right raises
every sample's true-class score until the argmax is right; one with its sign flipped (a
focal loss written ``(1 - p) ** g * log(p)`` without its minus) drives the true class's
probability to zero, and the loss "falls" while the predictions become wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.framework.preserve import preserved_training_state

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

STEPS = 40
LEARNING_RATE = 0.3


@dataclass(frozen=True)
class Descent:
    loss_before: float
    loss_after: float
    true_probability_before: float  # mean softmax probability of each sample's label
    true_probability_after: float
    accuracy_before: float
    accuracy_after: float


def class_labels(batch: Any) -> torch.Tensor | None:
    """The (B,) integer labels of an ``(inputs, labels)`` batch."""
    if not isinstance(batch, (list, tuple)) or len(batch) != 2:
        return None
    labels = batch[1]
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or labels.is_floating_point() \
            or labels.dtype == torch.bool or labels.numel() < 2:
        return None
    return labels


def scalar_loss(output: Any) -> torch.Tensor | None:
    loss = output[0] if isinstance(output, tuple) else output
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad else None


class FixedOutputs(torch.nn.Module):
    """Stands in for the model during the descent: returns the free scores, whatever it is given,
    so the model itself runs once (a large one would make 40 forwards slow)."""

    def __init__(self, scores: torch.Tensor) -> None:
        super().__init__()
        self.scores = scores
        self.calls = 0

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.calls += 1
        return self.scores


def descend_on_outputs(ctx: PreflightContext, batch: Any) -> Descent | None:
    """The loss and the labels' scores before and after STEPS of descent on the model's (B, C)
    class scores; None where the batch has no class labels, the model is called other than once
    with one (B, C) output covering the labels, or the loss needs more of the model than its
    output (an attribute, a second call)."""
    labels = class_labels(batch)
    if labels is None:
        return None
    seen: list[Any] = []

    def keep(module: torch.nn.Module, args: tuple, output: Any) -> None:
        seen.append(output)

    handle = ctx.model.register_forward_hook(keep)
    try:
        with preserved_training_state(ctx), torch.no_grad():
            ctx.model.eval()
            ctx.compute_loss(ctx.model, batch)
    except Exception:  # noqa: BLE001 - a loss this probe cannot drive says nothing either way
        return None
    finally:
        handle.remove()
    scores = seen[0] if len(seen) == 1 else None
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2 or not scores.is_floating_point() \
            or len(scores) != len(labels) or scores.shape[1] < 2 or int(labels.min()) < 0 \
            or int(labels.max()) >= scores.shape[1]:
        return None
    free = scores.detach().float().clone().requires_grad_(True)
    stand_in = FixedOutputs(free)
    optimizer = torch.optim.Adam([free], lr=LEARNING_RATE)
    before = _label_scores(free.detach(), labels)
    start = after_loss = None
    try:
        with torch.enable_grad():
            for _ in range(STEPS):
                stand_in.calls = 0
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(0)  # a loss that samples (negatives, noise) samples the same each call
                    value = scalar_loss(ctx.compute_loss(stand_in, batch))
                if value is None or stand_in.calls != 1 or not torch.isfinite(value):
                    break
                start = float(value.detach()) if start is None else start
                after_loss = float(value.detach())
                (gradient,) = torch.autograd.grad(value, [free], allow_unused=True)
                if gradient is None:
                    return None
                optimizer.zero_grad()
                free.grad = gradient
                optimizer.step()
    except Exception:  # noqa: BLE001 - a loss that needs more of the model than its output
        return None
    if start is None or after_loss is None:
        return None
    after = _label_scores(free.detach(), labels)
    return Descent(start, after_loss, before[0], after[0], before[1], after[1])


def _label_scores(scores: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    labels = labels.to(scores.device)
    probabilities = scores.softmax(-1).gather(1, labels[:, None]).squeeze(1)
    accuracy = (scores.argmax(-1) == labels).float().mean()
    return float(probabilities.mean()), float(accuracy)


def rewards_mistakes(found: Descent, classes: int) -> bool:
    """The descent lowered the loss by pushing the labels' probability towards zero: the
    optimum the loss leads to is wrong on nearly every sample."""
    chance = 1.0 / classes
    return (math.isfinite(found.loss_after) and found.loss_after < found.loss_before
            and found.accuracy_after <= 0.05 and found.true_probability_after < 0.5 * min(found.true_probability_before,
                                                                                         chance))
