"""Labels that are the untrained model's own guesses (pure functions over what the loss spy saw).

Pseudo-labels computed once, when the dataset is built, from a model that has not been trained
yet (``pseudo = model(x_unlabelled).argmax(1)`` before the loop) match the model's argmax at step
0 on nearly every row, far above what two unrelated labellings share by chance. Labels a model
computes inside the loss (online pseudo-labelling, FixMatch) match too, by design, so only a
target the DataLoader delivered counts; and a trained model may agree with true labels, so the
model must still be at its default init (``init_state.untrained``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_ROWS = 32
MIN_AGREEMENT = 0.85
MIN_OVER_CHANCE = 0.3


@dataclass
class ArgmaxAgreement:
    agreement: float  # share of rows whose target is the input's argmax
    chance: float  # what two independent labellings with these class shares agree on
    rows: int
    classes: int  # distinct target classes


def argmax_agreement(inputs: torch.Tensor, target: torch.Tensor, ignore_index: int | None) -> ArgmaxAgreement | None:
    """For a class criterion's (B, C) logits and (B,) class ids."""
    if inputs.dim() != 2 or target.dim() != 1 or target.is_floating_point() or inputs.shape[0] != target.shape[0] \
            or inputs.shape[1] < 2:
        return None
    with torch.no_grad():
        kept = target != ignore_index if ignore_index is not None else torch.ones_like(target, dtype=torch.bool)
        guesses, labels = inputs.detach()[kept].argmax(dim=1), target.detach()[kept].long()
        rows, classes = int(labels.numel()), inputs.shape[1]
        if rows < MIN_ROWS or bool((labels < 0).any()) or bool((labels >= classes).any()):
            return None
        guess_share = torch.bincount(guesses, minlength=classes).double() / rows
        label_share = torch.bincount(labels, minlength=classes).double() / rows
        return ArgmaxAgreement(float((guesses == labels).double().mean()), float((guess_share * label_share).sum()),
                               rows, int((label_share > 0).sum()))


def labels_are_initial_guesses(found: ArgmaxAgreement | None) -> bool:
    return (found is not None and found.classes >= 2 and found.agreement >= MIN_AGREEMENT
            and found.agreement - found.chance >= MIN_OVER_CHANCE)
