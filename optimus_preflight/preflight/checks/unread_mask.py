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
from optimus_preflight.preflight.checks.split_missing import is_mask
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

VAL_READ_BUDGET_S = 5.0
UNLABELLED_SHARE = 0.2  # of the positions the mask leaves out, for a placeholder to matter


COPIES = {"to", "cuda", "cpu", "clone", "contiguous", "detach", "bool", "long", "int", "float", "type", "view",
          "reshape", "squeeze", "unsqueeze", "flatten"}


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
        name = getattr(func, "__name__", "")
        # Unpacking a batch of one (mask[0]) selects the mask; indexing something else by it reads it.
        selected = name == "__getitem__" and len(given) == 1 and args and given[0] is args[0]
        if given and (name in COPIES or selected) and isinstance(result, torch.Tensor):
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


def is_observed_mask(tensor: Any) -> bool:
    """A boolean tensor, or one of only 0s and 1s, with at least UNLABELLED_SHARE zeros."""
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided or tensor.dim() == 0 \
            or tensor.numel() < 8:
        return False
    return is_mask(tensor) and float((tensor.detach() == 0).float().mean()) >= UNLABELLED_SHARE


def fill_mask(batch: Any) -> tuple[int, float, torch.Tensor, int] | None:
    """(index of the mask leaf, the fill value, the mask, index of the value leaf) for a 0/1
    mask shaped like a float leaf of the batch (not its first: the inputs) whose left-out values
    are one number while the kept ones vary: missing regression targets stored as a fill value."""
    found = list(leaves(batch))
    for mask_index, mask in enumerate(found):
        if not is_observed_mask(mask):
            continue
        kept = mask.detach().bool()
        for value_index, values in enumerate(found):
            if value_index in (0, mask_index) or not isinstance(values, torch.Tensor) \
                    or values.layout != torch.strided or not values.is_floating_point() or values.shape != mask.shape:
                continue
            outside = values[~kept.to(values.device)].unique()
            if outside.numel() == 1 and values[kept.to(values.device)].unique().numel() >= 8:
                return mask_index, float(outside[0]) + 0.0, mask, value_index  # -0.0 reads as 0
    return None


def split_mask(batch: Any, trained: int) -> tuple[int, torch.Tensor, int] | None:
    """(index of the mask leaf, the mask, index of the label leaf) for a boolean leaf shaped like
    an integer label leaf of ``trained`` positions whose left-out positions hold real labels
    (several classes): the training part of a transductive split (a node ``train_mask``)."""
    found = list(leaves(batch))
    for mask_index, mask in enumerate(found):
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.numel() != trained:
            continue
        if float((~mask).float().mean()) < UNLABELLED_SHARE or not bool(mask.any()):
            continue
        for label_index, labels in enumerate(found):
            if isinstance(labels, torch.Tensor) and labels.shape == mask.shape and not labels.is_floating_point() \
                    and labels.dtype != torch.bool and labels[~mask.to(labels.device)].unique().numel() >= 2:
                return mask_index, mask, label_index
    return None


def held_out_positions(train_batch: Any, val_batch: Any, mask_index: int, label_index: int) -> int:
    """How many positions the validation batch's mask selects that the training mask leaves out,
    when both batches carry the same labels (one graph, two masks); 0 otherwise."""
    train, val = list(leaves(train_batch)), list(leaves(val_batch))
    if len(val) != len(train):
        return 0
    train_mask, val_mask = train[mask_index], val[mask_index]
    train_labels, val_labels = train[label_index], val[label_index]
    if not all(isinstance(t, torch.Tensor) for t in (val_mask, val_labels)) or val_mask.dtype != torch.bool \
            or val_mask.shape != train_mask.shape or val_labels.shape != train_labels.shape \
            or not torch.equal(val_labels.cpu(), train_labels.cpu()):
        return 0
    return int((val_mask.cpu() & ~train_mask.cpu()).sum())


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
            self._split_mask_unread(ctx, calls, batch, findings)
            if not findings.issues:
                self._fill_mask_unread(ctx, batch, findings)
            return
        call, (mask_index, placeholder, mask, _) = found
        if self._reads(ctx, batch, mask_index, findings):
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

    @staticmethod
    def _reads(ctx: PreflightContext, batch: Any, mask_index: int, findings: Findings) -> bool:
        """Whether the eval-mode step reads the batch's mask leaf (True, too, when it cannot be
        observed: nothing is concluded then)."""
        reads = MaskReads(list(leaves(batch))[mask_index])
        try:
            with reads:
                eval_forward(ctx, batch)
        except Exception:
            findings.data["summary"] = "the step could not be observed"
            return True
        if reads.read:
            findings.data["summary"] = "the step reads the batch's mask"
        return reads.read

    def _split_mask_unread(self, ctx: PreflightContext, calls: list, batch: Any, findings: Findings) -> None:
        """A train_mask over one graph the loss never applies, where the validation loader's mask
        over the same labels selects positions it leaves out: the loss trains on them."""
        findings.data["summary"] = "no boolean mask beside class targets trained in full"
        found = next(((call, hit) for call in calls if (hit := split_mask(batch, call.profile.total)) is not None), None)
        if found is None or ctx.val_loader is None:
            return
        call, (mask_index, mask, label_index) = found
        parts = read_samples(ctx, self.name, findings, ctx.val_loader, f"a validation batch for {self.name}",
                             lambda val_batch: [val_batch], 1, VAL_READ_BUDGET_S)
        if not parts:
            return
        held_out = held_out_positions(ctx.artifacts.first_batch, parts[0][0], mask_index, label_index)
        if not held_out or self._reads(ctx, batch, mask_index, findings):
            return
        left_out = int((~mask).sum())
        findings.data["summary"] = f"a {tuple(mask.shape)} train mask the step never reads"
        findings.warning(
            "TARGET_MASK_UNUSED",
            f"the loss trains on the validation labels: the batch carries a boolean {tuple(mask.shape)} mask beside "
            f"{call.function}'s targets of the same shape ({int(mask.sum())} positions True) and the step never reads "
            f"it, so {call.function} is taken over all {call.profile.total} targets, the {left_out} the mask leaves "
            f"out included. The validation loader holds the same labels with its own mask, and {held_out} of the "
            "positions it scores are among those trained on: validation accuracy measures memorised labels, not "
            "generalisation (a node classifier whose train_mask is never applied)",
            "Apply the mask in the loss: F.cross_entropy(logits[train_mask], y[train_mask]) (and score validation "
            "on logits[val_mask] only).",
            "data.train",
        )

    def _fill_mask_unread(self, ctx: PreflightContext, batch: Any, findings: Findings) -> None:
        """Missing regression targets stored as a fill value beside a mask of the observed ones,
        and a step that never reads the mask: the loss fits the fill."""
        found = fill_mask(batch)
        if found is None or self._reads(ctx, batch, found[0], findings):
            return
        _, fill, mask, _ = found
        left_out = int((mask == 0).sum())
        findings.data["summary"] = f"a {tuple(mask.shape)} observed-mask the step never reads"
        findings.warning(
            "TARGET_MASK_UNUSED",
            f"the batch carries a 0/1 {tuple(mask.shape)} mask beside float targets of the same shape, and the step "
            f"never reads it: where the mask is 0 ({left_out}, {left_out / mask.numel():.0%} of the values) every "
            f"target is {fill:g}, a fill for missing values, while the observed ones vary. The loss averages over "
            f"every target, the missing ones included, so the model is trained to predict the fill {fill:g} wherever "
            "a value was missing (a masked loss whose mask was left out)",
            "Weight the error by the mask: loss = ((pred - y) ** 2 * mask).sum() / mask.sum() (or pred[mask.bool()], "
            "y[mask.bool()]).",
            "data.train",
        )
