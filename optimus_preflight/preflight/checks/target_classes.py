"""More batches for a one-class verdict (``step.targets``). The step sees one batch, and
a batch of an imbalanced binary task can hold one class by chance (at 5% positives, a
batch of 32 has none 19% of the time). So when the first batch's targets hold a single
value, the loader is read on (labels only, no forward) until another value shows up,
``ONE_CLASS_MIN_TARGETS`` targets are seen, the epoch ends or the budget runs out.

The labels are found in the batch as the leaf whose kept values are exactly the
criterion's one value: the same tensor, or the one it was flattened or shifted from.
A constant target that is not in the batch is built by ``compute_loss`` on purpose
(MoCo's InfoNCE: ``labels = zeros(N)``, the positive at index 0; a GAN's all-real
labels), and says nothing about the data: no verdict.

The same reading serves ``TARGET_FEW_CLASSES``: per-sample class targets that use at most
half of the head's classes in the first batch are read on until more show up. A label
column scaled with the features and cast back to integers (grades 0-3 min-max scaled, then
``.long()``: 0, 0, 0, 1) leaves valid ids of too few classes, which no range check sees.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.target_profile import ONE_CLASS_MIN_TARGETS
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.analyses.loss_spy import CriterionCall
    from optimus_preflight.preflight.framework import Findings
    from optimus_preflight.preflight.framework.context import PreflightContext

SCAN_BATCHES = 32
SCAN_BUDGET_S = 2.0


def _kept(leaf: torch.Tensor, ignore_index: int | None) -> torch.Tensor:
    return leaf[leaf != ignore_index] if ignore_index is not None and not leaf.is_floating_point() else leaf.reshape(-1)


def label_leaf(batch: Any, call: CriterionCall) -> int | None:
    """Index (in ``leaves(batch)`` order) of the tensor holding the criterion's labels:
    one of the target's size first (an all-ones attention mask beside all-one labels is
    not the labels), else one it was shifted or reshaped from."""
    value, hard = call.profile.only_value, call.hard_targets
    matches = []
    for index, leaf in enumerate(leaves(batch)):
        if not isinstance(leaf, torch.Tensor) or leaf.dim() == 0 or leaf.is_floating_point() == hard:
            continue
        kept = _kept(leaf, call.ignore_index)
        if kept.numel() and bool((kept == value).all()):
            matches.append((leaf.numel() != call.profile.total, index))
    return min(matches)[1] if matches else None


def scan_labels(ctx: PreflightContext, findings: Findings, check: str, call: CriterionCall) -> tuple[int, int, bool]:
    """(targets seen, batches read, whole epoch read) while every label equals the first
    batch's one value; (0, n, False) as soon as another value shows up, or when the
    target is not one of the batch's tensors."""
    seen, batches = call.profile.kept, 1
    index = label_leaf(ctx.artifacts.first_batch, call)
    if index is None:
        return 0, batches, False
    if seen >= ONE_CLASS_MIN_TARGETS or ctx.artifacts.data_hang is not None:
        return seen, batches, False  # enough already; or the data code hung once: no more calls into it
    guard = DataGuard(ctx, check, findings)
    seen, batches, started = 0, 0, time.perf_counter()
    with preserved_data_state(ctx), guard.batches(ctx.train_loader, "labels for step.targets") as stream:
        for batch in stream:
            found = list(leaves(batch))
            if index >= len(found) or not isinstance(found[index], torch.Tensor):
                return seen, batches, False  # another batch structure: judge no further
            kept = _kept(found[index], call.ignore_index)
            if bool((kept != call.profile.only_value).any()):
                return 0, batches + 1, False
            seen, batches = seen + kept.numel(), batches + 1
            if seen >= ONE_CLASS_MIN_TARGETS or batches >= SCAN_BATCHES or \
                    time.perf_counter() - started > SCAN_BUDGET_S:
                return seen, batches, False
    return seen, batches, True


# A class of the head that never shows up in this many targets per class is not chance: at
# 20 targets per class, a class of even 5% share is missed with probability under 1e-4 at C=4.
FEW_CLASSES_PER_CLASS = 20


def few_classes_enough(classes: int) -> int:
    # Past 1,024 targets, two classes of 0.5% each both stay unseen with probability 3e-5.
    return max(FEW_CLASSES_PER_CLASS * classes, 1024)


def few_classes_candidate(call: CriterionCall) -> bool:
    """Per-sample hard targets of a class criterion holding at most half of its classes; not
    in-batch similarities (a @ b.T), whose 'classes' are the batch's positions
    (step.contrastive_targets judges their targets)."""
    profile = call.profile
    classes = call.n_classes or 0
    return (call.function in ("cross_entropy", "nll_loss") and call.hard_targets and profile is not None
            and not call.similarity_product
            and profile.per_sample and classes >= 3 and 2 <= profile.distinct <= classes // 2)


def per_sample_label_leaf(batch: Any, call: CriterionCall) -> int | None:
    """Index (in ``leaves(batch)`` order) of the batch's one integer ``(B,)``/``(B, 1)`` tensor
    with the criterion's number of distinct targets."""
    found = []
    for index, leaf in enumerate(leaves(batch)):
        if not isinstance(leaf, torch.Tensor) or leaf.is_floating_point() or leaf.dtype == torch.bool \
                or leaf.numel() != call.profile.total or leaf.dim() not in (1, 2) or leaf.shape[0] != leaf.numel():
            continue
        if int(_kept(leaf, call.ignore_index).unique().numel()) == call.profile.distinct:
            found.append(index)
    return found[0] if len(found) == 1 else None


def scan_classes(ctx: PreflightContext, findings: Findings, check: str, call: CriterionCall,
                 index: int, loader: Any = None) -> tuple[list[int], int, bool]:
    """(the classes seen, targets seen, whole epoch read), reading labels (of the training loader
    unless ``loader`` is given) until more than half of the head's classes show up, enough
    targets are seen, the epoch ends or the budget runs out."""
    classes = call.n_classes or 0
    enough = few_classes_enough(classes)
    seen_classes: set[int] = set()
    seen, started = 0, time.perf_counter()
    guard = DataGuard(ctx, check, findings)
    with preserved_data_state(ctx), guard.batches(loader if loader is not None else ctx.train_loader,
                                                  "labels for step.targets") as stream:
        for batches, batch in enumerate(stream, start=1):
            found = list(leaves(batch))
            if index >= len(found) or not isinstance(found[index], torch.Tensor):
                return sorted(seen_classes), 0, False  # another batch structure: judge no further
            kept = _kept(found[index], call.ignore_index)
            seen_classes.update(int(value) for value in kept.unique().tolist())
            seen += kept.numel()
            if len(seen_classes) > classes // 2:
                return sorted(seen_classes), seen, False
            if seen >= enough or batches >= 4 * SCAN_BATCHES or time.perf_counter() - started > SCAN_BUDGET_S:
                return sorted(seen_classes), seen, False
    return sorted(seen_classes), seen, True


def few_classes_message(call: CriterionCall, used: list[int], seen: int, whole_epoch: bool,
                        validated: list[int] | None = None) -> tuple[str, str]:
    classes = call.n_classes or 0
    missing = [c for c in range(classes) if c not in used]
    shown = ", ".join(str(c) for c in missing[:8]) + (", ..." if len(missing) > 8 else "")
    where = "the whole training epoch" if whole_epoch else f"the first {seen} training targets"
    # The lowest ids used, every id above them unused: also a head grown for new classes whose labels
    # kept their own task's ids (class-incremental learning without an offset).
    grown = used == list(range(len(used))) and missing == list(range(len(used), classes))
    incremental = (f". A head extended for new classes whose labels kept their task-local ids 0..{len(used) - 1} "
                   "(not offset by the number of old classes) does this too: the new classes are trained onto the old "
                   "classes' outputs and the new outputs never get a positive target" if grown else "")
    offset = (f" In class-incremental training, offset the new task's labels by the number of classes seen before "
              f"(y = y + n_old_classes, onto outputs {len(used)}..{classes - 1})." if grown else "")
    in_validation = [c for c in missing if c in (validated or ())]
    if in_validation and len(in_validation) * 2 >= len(missing):
        # The classes training lacks are there in validation: whole classes went to one side.
        named = ", ".join(str(c) for c in in_validation[:8])
        return (
            f"the model has {classes} class outputs, but {where} use only {len(used)} of them "
            f"({', '.join(str(c) for c in used[:8])}), while the validation labels hold classes {named} that "
            "training never has: the training labels are a class-sorted part of the data. Rows (or graph nodes) "
            "stored grouped by class and split by position (the first half of the ids for training, the rest for "
            "validation) do this, as do training labels taken as a slice of the label array (y[:n_train]) instead "
            "of indexed with the training indices (y[train_idx]); the head never learns the missing classes and "
            "validation scores them all wrong" + incremental,
            "Split a random permutation: perm = torch.randperm(n); train_idx, val_idx = perm[:k], perm[k:] (or "
            "stratify by class), and take each split's labels with its own indices: y[train_idx], y[val_idx]."
            + offset,
        )
    return (
        f"the model has {classes} class outputs, but {where} use only {len(used)} of them "
        f"({', '.join(str(c) for c in used[:8])}): classes {shown} are never a target, so the head only learns never "
        "to predict them. Labels squeezed into fewer ids on the way do this: a label column scaled with the features "
        "(min-max or standardisation of the whole table) and cast back with .long(), which truncates grades 0, 1, 2, 3 "
        "(0, 0.33, 0.67, 1.0) to 0, 0, 0, 1; a threshold, binning or integer division that merges classes; or "
        "labels taken from another column" + incremental,
        "Keep the label column out of the feature scaling (scale X only; take y as the original integer ids) and "
        f"check that torch.unique of the training labels is 0..{classes - 1}; if the data truly has {len(used)} "
        f"classes, build the head with {len(used)} outputs." + offset,
    )
