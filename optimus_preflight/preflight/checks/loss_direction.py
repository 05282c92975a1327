"""A loss that does not punish confident mistakes on one class (``step.loss_direction``).

``LOSS_IGNORES_MISTAKES``: a classification loss must cost more when the model is confidently
wrong than when it is confidently right, for every class. A hand-written loss can break
that for one class while looking fine on average: a focal loss that modulates with
``(1 - p) ** gamma`` where ``(1 - p_t) ** gamma`` is meant makes a confident false positive
nearly free (its factor ``(1 - p)`` is about 0), so the negatives stop pushing the model
down; a target flipped inside the loss, a weight of 0 on one class do the same.

Measured with the model in eval mode on the first batch, for a model returning one tensor
of logits that a class criterion scores (the first step saw it; embeddings for a contrastive
loss are not logits): binary ``(B,)``/``(B, 1)`` logits with 0/1 targets, or ``(B, C)`` logits with class
ids. ``compute_loss`` runs with the logits replaced by confident answers (``MARGIN`` in
favour of one class): all right; then, for each class, its samples confidently wrong and
the rest right; and all logits 0 (no opinion). A class whose mistakes cost less than a
small share of the step from "right" to "no opinion" is the finding.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.eval_forward import eval_forward, loss_value, loss_with_output
from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import batch_size_of, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MARGIN = 8.0  # logits in favour of the answer: a confident one (sigmoid(8) = 0.9997)
CHEAP = 0.05  # a class's mistakes cost less than this share of the way from right to no opinion
MIN_SAMPLES = 4  # of a class in the batch before its mistakes are judged
MAX_CLASSES = 50
CLASS_LOSSES = ("cross_entropy", "nll_loss", "binary_cross_entropy_with_logits", "binary_cross_entropy")


def _targets(batch: Any, rows: int) -> torch.Tensor | None:
    """The batch's class targets: the last tensor of an ``(x, ..., y)`` batch, (B,) or (B, 1)."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[-1], torch.Tensor):
        return None
    target = batch[-1]
    if target.dim() == 2 and target.shape[1] == 1:
        target = target[:, 0]
    if target.dim() != 1 or target.shape[0] != rows or target.dtype == torch.bool:
        return None
    values = target.detach()
    if not bool((values == values.round()).all()) or float(values.min()) < 0:
        return None
    return values.long().cpu()


def _answers(logits: torch.Tensor, classes: torch.Tensor, binary: bool) -> torch.Tensor:
    """Logits shaped like ``logits`` that answer ``classes`` with confidence MARGIN."""
    if binary:
        signs = classes.to(logits.device, logits.dtype) * 2 - 1
        return (signs * MARGIN).reshape(logits.shape)
    answers = torch.full_like(logits, -MARGIN / 2)
    answers[torch.arange(len(classes), device=logits.device), classes.to(logits.device)] = MARGIN / 2
    return answers


def replaced_loss(ctx: PreflightContext, batch: Any, logits: torch.Tensor) -> float | None:
    return loss_with_output(ctx, batch, lambda output: logits.to(output.dtype) if output.shape == logits.shape
                            else output)


class LossDirectionCheck(Check):
    """LOSS_IGNORES_MISTAKES: confident mistakes on one class cost about as little as right answers."""

    name = "step.loss_direction"
    stage = Stage.STEP
    codes = ("LOSS_IGNORES_MISTAKES",)
    requires = (FIRST_BATCH, FIRST_STEP)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "not a classifier returning one tensor of logits"
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        if _targets(batch, batch_size_of(batch) or 0) is None:
            return  # no (B,) class targets: nothing to answer confidently
        seen: list[torch.Tensor] = []
        handle = ctx.model.register_forward_hook(lambda module, args, output: seen.append(output))
        try:
            base = loss_value(eval_forward(ctx, batch))
        except Exception:
            return
        finally:
            handle.remove()
        if base is None or len(seen) != 1 or not isinstance(seen[0], torch.Tensor) or not seen[0].is_floating_point():
            return
        logits = seen[0].detach()
        rows = logits.shape[0] if logits.dim() else 0
        target = _targets(batch, rows)
        if target is None:
            return
        binary = logits.dim() == 1 or (logits.dim() == 2 and logits.shape[1] == 1)
        classes = 2 if binary else (logits.shape[1] if logits.dim() == 2 else 0)
        if not 2 <= classes <= MAX_CLASSES or int(target.max()) >= classes:
            return
        if bool(((logits >= 0) & (logits <= 1)).all()):
            return  # probabilities, not logits: confident answers would leave their range
        probe = get_probe(ctx)
        # (B, C) logits under a binary criterion are C labels per sample (multi-label, a hazard per
        # interval), not one class id: the batch's (B,) integers are then something else.
        scored = any(call.function in (CLASS_LOSSES[2:] if binary else CLASS_LOSSES[:2]) and call.input is not None
                     and math.prod(call.input.shape) == logits.numel() for call in probe.criterion_calls)
        # A class loss written by hand (a focal loss from log_softmax and gather) normalises the logits itself.
        scored = scored or (not binary and tuple(logits.shape) in probe.normalised_shapes)
        # One logit per sample against 0/1 targets is a binary classifier even when the loss is
        # written out by hand (a focal loss from torch.sigmoid); a wider output may be embeddings.
        if not scored and not (binary and int(target.max()) <= 1):
            return  # the output is not what a class criterion scores (embeddings for a contrastive loss)
        try:
            right = replaced_loss(ctx, batch, _answers(logits, target, binary))
            neutral = replaced_loss(ctx, batch, torch.zeros_like(logits))
            if right is None or neutral is None or neutral - right <= 0:
                return
            cheap = []
            for label in range(classes):
                mine = target == label
                if int(mine.sum()) < MIN_SAMPLES:
                    continue
                wrong = torch.where(mine, (target + 1) % classes, target)
                mistaken = replaced_loss(ctx, batch, _answers(logits, wrong, binary))
                if mistaken is not None and mistaken - right < CHEAP * (neutral - right):
                    cheap.append((label, int(mine.sum()), mistaken))
        except Exception:
            return
        findings.data.update(right=right, neutral=neutral, cheap_classes=[label for label, _, _ in cheap])
        findings.data["summary"] = (f"loss {right:.3g} when confidently right, {neutral:.3g} with no opinion; "
                                    f"{len(cheap)} class(es) whose confident mistakes cost about nothing")
        if not cheap:
            return
        label, count, mistaken = cheap[0]
        judged = sum(int((target == c).sum()) >= MIN_SAMPLES for c in range(classes))
        if len(cheap) == judged and judged >= 2:
            findings.warning(
                "LOSS_IGNORES_MISTAKES",
                f"the loss barely punishes confident mistakes on any class: with every sample of the first batch "
                f"confidently wrong (logits {MARGIN:g} the other way) it is at most {max(m for _, _, m in cheap):.3g}, "
                f"against {right:.3g} with every answer right and {neutral:.3g} with no opinion at all, so the "
                "loss is highest in between and its gradient pushes uncertain answers towards either side, the wrong "
                "one as readily as the right one. A hand-written focal loss that modulates by p_t ** gamma (the "
                "probability of the true class) where (1 - p_t) ** gamma is meant does this: it down-weights the "
                "mistakes instead of the easy examples; so does (1 - p_t) ** gamma with p_t read from the top "
                "class (softmax(logits).max(1)) instead of the true class, which makes every confident answer, "
                "wrong ones included, nearly free",
                "Modulate by one minus the probability of the true class: p_t = p * y + (1 - p) * (1 - y), loss = "
                "alpha_t * (1 - p_t) ** gamma * bce (torchvision.ops.sigmoid_focal_loss computes it); for classes, "
                "p_t = log_softmax(logits, 1).gather(1, y[:, None]).exp(), not the max; or use "
                "F.binary_cross_entropy_with_logits / F.cross_entropy, which always punish confident mistakes.",
            )
            return
        ignoring = next((call for call in get_probe(ctx).criterion_calls if call.ignore_index == label), None)
        if ignoring is not None:
            findings.warning(
                "LOSS_IGNORES_MISTAKES",
                f"the loss does not punish confident mistakes on class {label}: with the {count} class-{label} samples "
                f"of the first batch confidently wrong and the rest right it is {mistaken:.3g}, against {right:.3g} "
                f"with every answer right, because {ignoring.function} is called with ignore_index={label}: every "
                f"sample labelled {label} is left out of the loss, so class {label} never trains",
                f"Drop ignore_index when {label} is a real class (nn.CrossEntropyLoss() ignores -100 by default); "
                "keep an ignore_index only for an id that is no class.",
            )
            return
        findings.warning(
            "LOSS_IGNORES_MISTAKES",
            f"the loss barely punishes confident mistakes on class {label}: with the {count} class-{label} samples of "
            f"the first batch confidently wrong (logits {MARGIN:g} the other way) and the rest right it is "
            f"{mistaken:.3g}, against {right:.3g} with every answer right and {neutral:.3g} with no opinion at all. "
            "Those mistakes get almost no gradient, so the model is free to make them. A hand-written focal loss "
            "modulated by (1 - p) ** gamma with p = sigmoid(logit) for every sample, where (1 - p_t) ** gamma with "
            "p_t = p for positives and 1 - p for negatives is meant, does this to the negatives (a confident false "
            "positive has 1 - p near 0); so does a target flipped or a class weighted 0 inside the loss",
            "Modulate by the probability of the true class: p_t = p * y + (1 - p) * (1 - y), loss = alpha_t * (1 - "
            "p_t) ** gamma * bce (torchvision.ops.sigmoid_focal_loss computes it); check each class's term and weight.",
        )
