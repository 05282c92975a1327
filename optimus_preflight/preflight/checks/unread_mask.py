"""A label mask the batch carries and the step never reads (``step.unread_mask``).

Semi-supervised and partially labelled data (node classification with a ``train_mask``,
segmentation with a "labelled" map, sequences with a loss mask) store every unlabelled
position with a placeholder label, usually 0, and a boolean mask of the positions that
count. A loss taken over all positions (``cross_entropy(logits, y)`` where
``logits[mask], y[mask]`` was meant) trains the placeholder as a class: with most positions
unlabelled, the model learns that everything is class 0, and its loss falls.

Read from the step, not from names: the first batch holds a boolean tensor of the shape of
the class targets a criterion trained on in full (no position ignored); wherever it is False
every target is one value; and the step's eval-mode ``compute_loss`` passes that tensor (or a
view of it) to no torch function at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

UNLABELLED_SHARE = 0.2  # of the positions the mask leaves out, for a placeholder to matter


COPIES = {"to", "cuda", "cpu", "clone", "contiguous", "detach", "bool", "long", "int", "float", "type"}


class MaskReads(TorchFunctionMode):
    """Whether a torch function is given the mask, or a copy or device move of it (indexing
    included); moving or copying it is not reading it (the step moves every batch tensor)."""

    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__()
        self.watched = {mask.untyped_storage().data_ptr()}
        self.read = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        given = [value for value in leaves((args, kwargs)) if isinstance(value, torch.Tensor)
                 and value.untyped_storage().data_ptr() in self.watched]
        if given and getattr(func, "__name__", "") in COPIES and isinstance(result, torch.Tensor):
            self.watched.add(result.untyped_storage().data_ptr())
        elif given:
            self.read = True
        return result


def placeholder_mask(batch: Any, classes: int, trained: int) -> tuple[int, int, torch.Tensor, int] | None:
    """(index of the mask leaf, the placeholder label, the mask, index of the label leaf) for a
    boolean leaf shaped like an integer label leaf of ``trained`` positions, where every label
    the mask leaves out is one value while the masked-in labels hold several."""
    found = list(leaves(batch))
    for mask_index, mask in enumerate(found):
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.numel() != trained:
            continue
        left_out = ~mask
        if float(left_out.float().mean()) < UNLABELLED_SHARE or bool(mask.all()):
            continue
        for label_index, labels in enumerate(found):
            if not isinstance(labels, torch.Tensor) or labels.shape != mask.shape or labels.is_floating_point() \
                    or labels.dtype == torch.bool:
                continue
            outside = labels[left_out.to(labels.device)].unique()
            inside = labels[mask.to(labels.device)].unique()
            if outside.numel() == 1 and inside.numel() >= 2 and 0 <= int(outside[0]) < classes:
                return mask_index, int(outside[0]), mask, label_index
    return None


class UnreadMaskCheck(Check):
    """TARGET_MASK_UNUSED: placeholder labels trained because the batch's mask is never read."""

    name = "step.unread_mask"
    stage = Stage.STEP
    codes = ("TARGET_MASK_UNUSED",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        probe = get_probe(ctx)
        calls = [call for call in probe.criterion_calls if call.function in ("cross_entropy", "nll_loss")
                 and call.hard_targets and call.profile is not None and call.n_classes
                 and call.profile.kept == call.profile.total]
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        found = next(((call, hit) for call in calls
                      if (hit := placeholder_mask(batch, call.n_classes, call.profile.total)) is not None), None)
        if found is None:
            findings.data["summary"] = "no boolean mask beside class targets trained in full"
            return
        call, (mask_index, placeholder, mask, _) = found
        reads = MaskReads(list(leaves(batch))[mask_index])
        try:
            with reads:
                eval_forward(ctx, batch)
        except Exception:
            findings.data["summary"] = "the step could not be observed"
            return
        if reads.read:
            findings.data["summary"] = "the step reads the batch's mask"
            return
        left_out = int((~mask).sum())
        findings.data["summary"] = f"a {tuple(mask.shape)} mask the step never reads"
        findings.warning(
            "TARGET_MASK_UNUSED",
            f"the batch carries a boolean {tuple(mask.shape)} mask beside {call.function}'s class targets of the same "
            f"shape, and the step never reads it: {call.function} trains on all {call.profile.total} targets, while "
            f"where the mask is False ({left_out}, {left_out / mask.numel():.0%} of them) every target is "
            f"{placeholder}. Those are unlabelled positions (nodes outside the train_mask, pixels or tokens without "
            f"a label) stored with a placeholder, and the loss teaches the model that they are class {placeholder}",
            "Apply the mask in the loss: F.cross_entropy(logits[mask], y[mask]) (node classification: "
            f"logits[train_mask]), or store the unlabelled targets as -100, cross_entropy's ignore_index, instead of "
            f"{placeholder}.",
            "data.train",
        )
