"""What the targets a criterion gets say about the labels (tensor statistics, then pure
findings), beyond their range and dtype (``loss_findings.target_findings``):

- every target is ``ignore_index``: the mean over no targets is 0/0, a NaN loss whose
  cause is the labels, not the inputs or the learning rate;
- nearly every target ignored, with most rows holding none: a collator or truncation that
  masks the answers away (a prompt-masked fine-tune keeps at least one target per row);
- one class only: a label column read wrong, or a constant label. A batch of an
  imbalanced binary task can hold one class by chance, so this is judged on at least
  ``ONE_CLASS_MIN_TARGETS`` targets, or on a whole epoch (the check reads more batches
  when the first holds one class);
- multi-hot float targets to ``cross_entropy``: it accepts (B, C) class probabilities,
  and a multi-hot row (several 1s) is read as a distribution of mass > 1, a loss that
  scales with the number of labels and a softmax that can only spread between them.
  One-hot and soft labels sum to 1 per row and are fine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.analyses.padding import as_rows

if TYPE_CHECKING:
    from optimus_preflight.preflight.analyses.loss_findings import Finding
    from optimus_preflight.preflight.analyses.loss_spy import CriterionCall

MOSTLY_IGNORED = 0.95
MIN_TARGETS = 32  # fewer say nothing about a share
ONE_CLASS_MIN_TARGETS = 256
IN_BATCH_MIN_TARGETS = 8  # rows of (B, B) a @ b.T scores all given target 0
# A constant target beside batch labels of several values needs no long scan to be news.
COLLAPSED_MIN_TARGETS = 8
MIN_MULTI_ROWS = 8
SOFTMAXED_SHARE = 0.9  # of soft (B, C) rows of a binary criterion summing to 1: softmax over the labels
NORMALISED_MULTI_HOT_SHARE = 0.25  # of the rows: one-label rows are one-hot, the rest 1/k
_ROW_SUM_TOL = 1e-3


@dataclass
class TargetProfile:
    total: int  # target positions, ignored ones included
    kept: int  # not equal to ignore_index
    rows: int | None = None  # with a (rows, positions) structure
    rows_without_target: int | None = None
    distinct: int = 0  # distinct kept values
    only_value: float | None = None  # the value, when there is one
    per_sample: bool = False  # one target per sample ((B,) or (B, 1)): classification
    # Float targets of a class criterion (probabilities), summed along the class dim.
    row_sum_max: float | None = None
    binary: bool = False  # every float target is 0 or 1
    # Positions equal to ignore_index between kept targets of their row: not padding at a
    # sequence's ends but tokens inside it (an ignore_index that is also a real tag).
    ignored_inside: int = 0
    # Rows ignored at both their first and last position, and the ignored positions of the
    # smaller of those two edge runs (summed over the batch). Padding sits at one end; when
    # most rows are ignored at both, one end is real tokens (the "O" tags before an entity).
    rows_ignored_both_ends: int = 0
    ignored_lesser_edge: int = 0
    # Float (B, C) targets: rows whose non-zero entries are two or more equal values, a
    # multi-hot row divided by its label count (mixup and label smoothing give unequal ones).
    rows_total: int = 0
    uniform_multi_rows: int = 0
    # Soft (B, C) targets of a binary criterion, C of 3 or more: rows that are one distribution (sum 1)
    soft_rows: int = 0
    distribution_rows: int = 0
    cumulative: bool = False  # 0/1 rows of ones then zeros over three grades or more: ordinal levels y > k


def profile_target(function: str, target: torch.Tensor, ignore_index: int | None,
                   shapes: list[tuple[int, int]], class_dim: int | None) -> TargetProfile:
    with torch.no_grad():
        values = target.detach()
        hard = not values.is_floating_point()
        valid = values != ignore_index if hard and ignore_index is not None else None
        kept = values[valid] if valid is not None else values.reshape(-1)
        profile = TargetProfile(total=values.numel(), kept=kept.numel(),
                                per_sample=values.dim() == 1 or (values.dim() == 2 and values.shape[1] == 1))
        if valid is not None:
            rows = as_rows(valid, shapes)
            if rows is not None:
                if rows.dim() == 2 and rows.shape[1] > 1:
                    profile.per_sample = False  # (B*T,) targets flattened from a (B, T) token batch
                profile.rows = int(rows.shape[0])
                profile.rows_without_target = int((~rows.any(dim=1)).sum())
                # Kept targets both before and after a position: inside the sequence, not
                # the padding at either end (left- or right-padded).
                kept_before = rows.int().cummax(dim=1).values.bool()
                kept_after = rows.flip(1).int().cummax(dim=1).values.flip(1).bool()
                profile.ignored_inside = int((~rows & kept_before & kept_after).sum())
                has_target = rows.any(dim=1)
                both = has_target & ~rows[:, 0] & ~rows[:, -1]
                profile.rows_ignored_both_ends = int(both.sum())
                leading = int((~rows & ~kept_before)[has_target].sum())
                trailing = int((~rows & ~kept_after)[has_target].sum())
                profile.ignored_lesser_edge = min(leading, trailing)
        # Per-sample binary targets only: a (B, H, W) float mask is no label column, and a
        # sort of millions of its values would cost more than the step.
        if kept.numel() and (hard or (function.startswith("binary") and profile.per_sample)):
            unique = torch.unique(kept)
            profile.distinct = unique.numel()
            profile.only_value = float(unique[0]) if unique.numel() == 1 else None
        if not hard and class_dim is not None and values.dim() > class_dim and values.numel():
            floats = values.float()
            profile.row_sum_max = float(floats.sum(dim=class_dim).max())
            profile.binary = bool(((floats == 0) | (floats == 1)).all())
            if profile.binary and floats.dim() == 2 and class_dim == 1 and floats.shape[1] >= 2:
                # every row ones then zeros, three grades or more: ordinal levels y > k (CORAL)
                profile.cumulative = bool((floats[:, 1:] <= floats[:, :-1]).all()) and \
                    int(floats.sum(dim=1).unique().numel()) >= 3
            if floats.dim() == 2 and class_dim == 1 and not profile.binary and bool((floats >= 0).all()):
                positive = floats > 0
                count = positive.sum(dim=1)
                largest = floats.max(dim=1).values
                smallest = torch.where(positive, floats, torch.full_like(floats, float("inf"))).min(dim=1).values
                uniform = (count >= 2) & ((largest - smallest).abs() <= 1e-6 * largest.clamp_min(1e-12))
                profile.rows_total, profile.uniform_multi_rows = int(floats.shape[0]), int(uniform.sum())
        if not hard and function.startswith("binary") and values.dim() == 2 and values.shape[1] >= 3 and values.numel():
            floats = values.float()
            soft = ~((floats == 0) | (floats == 1)).all(dim=1) & (floats >= 0).all(dim=1) & (floats <= 1).all(dim=1)
            profile.soft_rows = int(soft.sum())
            profile.distribution_rows = int((soft & ((floats.sum(dim=1) - 1).abs() <= _ROW_SUM_TOL)).sum())
    return profile


def all_ignored(call: CriterionCall) -> bool:
    profile = call.profile
    return profile is not None and profile.total > 0 and profile.kept == 0 and call.ignore_index is not None


def all_ignored_message(call: CriterionCall, nan: bool) -> tuple[str, str]:
    """(message, fix) for a criterion whose every target is ignore_index; ``nan``: the
    returned loss is NaN (a mean, or a sum divided by the count of targets: 0/0)."""
    effect = "a loss averaged over zero targets is 0/0 = NaN" if nan else "the loss is 0 with no gradient"
    return (
        f"every one of the {call.profile.total} targets {call.function} got is ignore_index "
        f"({call.ignore_index}): {effect}, so nothing trains. The labels are the cause, not the inputs or "
        "the learning rate",
        f"Check how the labels are built: a collator or tokenisation step that sets every label to "
        f"{call.ignore_index} (prompt masking past the truncation length, a mask computed on the wrong "
        "tensor, or labels copied from the padded positions); each batch needs targets that are real class "
        "ids.",
    )


def profile_findings(calls: list[CriterionCall]) -> list[Finding]:
    """TARGET_ALL_IGNORED, TARGET_MOSTLY_IGNORED, TARGET_MULTI_HOT for each call."""
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    found: list[Finding] = []
    for call in calls:
        profile = call.profile
        if profile is None:
            continue
        if all_ignored(call):
            message, fix = all_ignored_message(call, nan=call.reduction == "mean")
            found.append(Finding("TARGET_ALL_IGNORED", "error", message, fix))
        elif call.ignore_index is not None and profile.total >= MIN_TARGETS and \
                profile.kept < (1 - MOSTLY_IGNORED) * profile.total and _rows_empty(profile):
            share = 1 - profile.kept / profile.total
            rows = (f"; {profile.rows_without_target} of {profile.rows} rows have no target at all"
                    if profile.rows else "")
            found.append(Finding(
                "TARGET_MOSTLY_IGNORED", "warning",
                f"{share:.1%} of the {profile.total} targets {call.function} got are ignore_index "
                f"({call.ignore_index}), only {profile.kept} train{rows}: each step learns from a sliver of "
                "the batch, and the loss of so few targets is noisy",
                "Check the label masking: truncation that cuts the answer off, or a mask that covers more than "
                "the prompt and the padding. If it is deliberate, larger batches keep the step's targets up.",
            ))
        ignored_class = _ignored_class_finding(call)
        if ignored_class is not None:
            found.append(ignored_class)
        if call.function.startswith("binary") and profile.soft_rows >= MIN_MULTI_ROWS and \
                profile.distribution_rows >= SOFTMAXED_SHARE * profile.soft_rows:
            found.append(Finding(
                "TARGET_MULTI_HOT", "warning",
                f"{call.function} gets soft multi-label targets that are one distribution per sample: "
                f"{profile.distribution_rows} of {profile.soft_rows} rows sum to 1 over their labels. A softmax made "
                "independent yes/no labels compete (a teacher's soft targets built with softmax over the tags): two "
                "true labels can get at most 1/2 each, so the student is taught to say no to every label",
                "Make each label's soft target its own probability: torch.sigmoid(teacher_logits / T) for multi-label "
                "distillation (softmax only for one label per sample, with cross_entropy / kl_div).",
            ))
        if call.function == "cross_entropy" and profile.binary and profile.row_sum_max is not None and \
                profile.row_sum_max > 1 + _ROW_SUM_TOL:
            found.append(_levels_in_cross_entropy(profile) if profile.cumulative else _multi_hot_in_cross_entropy(profile))
        elif call.function == "cross_entropy" and profile.rows_total >= MIN_MULTI_ROWS and \
                profile.uniform_multi_rows >= NORMALISED_MULTI_HOT_SHARE * profile.rows_total:
            found.append(Finding(
                "TARGET_MULTI_HOT", "error",
                f"cross_entropy gets multi-hot targets divided by their label count: {profile.uniform_multi_rows} of "
                f"{profile.rows_total} rows spread their mass equally over two or more labels (1/k each). A softmax "
                "over the classes makes the labels compete: a sample with k labels can at best give each 1/k, so the "
                "model never says yes to several labels at once, and no threshold recovers them",
                "For multi-label data use BCEWithLogitsLoss on the logits and the 0/1 multi-hot targets (one "
                "independent yes/no per class), with a sigmoid and a threshold at prediction time.",
            ))
    return found


def _levels_in_cross_entropy(profile: TargetProfile) -> Finding:
    """TARGET_MULTI_HOT for cumulative ordinal levels (CORAL) given to cross_entropy."""
    from optimus_preflight.preflight.analyses.loss_findings import Finding  # noqa: F811  (a cycle at import time)

    return Finding(
        "TARGET_MULTI_HOT", "error",
        f"cross_entropy gets cumulative ordinal levels as targets (each row ones then zeros, up to "
        f"{profile.row_sum_max:g} ones: an ordinal grade encoded as 'grade > k', CORAL / cumulative link): "
        "it reads them as one probability distribution per sample, so the levels compete in one softmax "
        "although each is its own yes/no, a row's mass grows with its grade, and per-level sigmoids decoded "
        "at prediction time were never trained",
        "Train each level as its own binary task: F.binary_cross_entropy_with_logits(level_logits, levels) "
        "instead of cross_entropy (decode the grade as (torch.sigmoid(level_logits) > 0.5).sum(1)).",
    )


def _multi_hot_in_cross_entropy(profile: TargetProfile) -> Finding:
    """TARGET_MULTI_HOT for 0/1 multi-hot rows given to cross_entropy."""
    from optimus_preflight.preflight.analyses.loss_findings import Finding  # noqa: F811  (a cycle at import time)

    return Finding(
        "TARGET_MULTI_HOT", "error",
        f"cross_entropy gets multi-hot float targets (0/1 values, rows summing up to "
        f"{profile.row_sum_max:g}): it reads float targets as one probability distribution per sample, "
        "so a row with several labels is a 'distribution' of mass > 1, the loss grows with the label "
        "count, and the softmax can only split one unit of probability between the labels",
        "For multi-label data use BCEWithLogitsLoss on the logits and these float targets (one "
        "independent yes/no per class); for one label per sample pass class indices "
        "(targets.argmax(dim=1), dtype long).",
    )


IGNORED_INSIDE_SHARE = 0.1  # of all positions: more than stray separators
DENSE_IGNORED_SHARE = 0.5  # of a label map's positions on an in-range ignore_index: the majority class
# Up to this many classes the ignored class is a tag or a label the task needs; beyond it the
# outputs are a vocabulary, where an in-range ignore_index is the pad token (and a prompt
# masked with it sits at the start of a right-padded row: both ends ignored, on purpose).
TAG_CLASSES = 1000
MIN_IGNORED_SAMPLES = 2  # per-sample targets: one stray label could be a mislabelled row


def _ignored_class_finding(call: CriterionCall) -> Finding | None:
    """TARGET_IGNORED_CLASS: an ignore_index inside 0..C-1 (a class the model predicts) that
    marks many positions inside the sequences, not only the padding at their ends: the
    ignore_index is also a real tag (0 = "O" in NER), which then never trains."""
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    profile, ignore = call.profile, call.ignore_index
    if (profile is None or ignore is None or not call.n_classes or not 0 <= ignore < call.n_classes
            or profile.total < MIN_TARGETS):
        return None
    shape = call.target_shape
    if shape is not None and len(shape) >= 3 and profile.total - profile.kept >= DENSE_IGNORED_SHARE * profile.total:
        # a label map (a target per pixel or voxel) has no padding at its ends: an in-range
        # ignore_index covering most of it is the commonest class, left out of the loss
        share = 1 - profile.kept / profile.total
        return Finding(
            "TARGET_IGNORED_CLASS", "warning",
            f"{call.function}'s ignore_index={ignore} is also class {ignore} of the model's {call.n_classes} outputs, "
            f"and {share:.0%} of the {profile.total} positions of the {tuple(shape)} label maps carry it: the "
            f"commonest class never trains, so the model is never shown what class {ignore} looks like and predicts "
            "the other classes everywhere (an ignore_index copied from a dataset whose 0 was the void label)",
            f"Drop ignore_index (nn.CrossEntropyLoss()) when {ignore} is a real class; keep an ignore_index for "
            "void pixels only, with an id outside 0..C-1 (255 or -100).",
        )
    ignored = profile.total - profile.kept
    if profile.per_sample and call.n_classes <= TAG_CLASSES and ignored >= MIN_IGNORED_SAMPLES \
            and profile.kept >= MIN_IGNORED_SAMPLES:
        # one label per sample has no padding to mark: an in-range ignore_index there drops
        # every sample of that class from the loss (ignore_index=0 kept from a token recipe
        # whose 0 was the pad id)
        return Finding(
            "TARGET_IGNORED_CLASS", "warning",
            f"{call.function}'s ignore_index={ignore} is also class {ignore} of the model's {call.n_classes} outputs, "
            f"and {ignored} of the {profile.total} samples of the batch are labelled {ignore}: with one label per "
            f"sample there is no padding to skip, so these are real class-{ignore} samples left out of the loss. "
            f"Class {ignore} never trains (its logit gets no gradient toward being right), and the model never learns "
            f"to predict it",
            f"Drop ignore_index (nn.CrossEntropyLoss(), or ignore_index=-100, the default) when {ignore} is a real "
            f"class; mark unlabelled samples with an id outside 0..{call.n_classes - 1} (-100) if some have no label.",
        )
    inside = profile.ignored_inside
    rows_with_target = (profile.rows or 0) - (profile.rows_without_target or 0)
    if call.n_classes <= TAG_CLASSES and rows_with_target and profile.rows_ignored_both_ends * 2 >= rows_with_target:
        inside += profile.ignored_lesser_edge
    if inside <= IGNORED_INSIDE_SHARE * profile.total:
        return None
    share = inside / profile.total
    return Finding(
        "TARGET_IGNORED_CLASS", "warning",
        f"{call.function}'s ignore_index={ignore} is also class {ignore} of the model's {call.n_classes} outputs, and "
        f"{share:.0%} of the {profile.total} target positions carry it inside the sequences (not only as padding "
        f"at their ends): those positions never train, and the model never learns to predict class {ignore}",
        f"Pad the targets with -100 (CrossEntropyLoss's default ignore_index) or another id outside 0.."
        f"{call.n_classes - 1}, and keep ignore_index for padding only; class {ignore} then trains like the others.",
    )


def _rows_empty(profile: TargetProfile) -> bool:
    """A sequence target needs most rows empty too: prompt-masked fine-tunes keep few
    targets per row, but keep some in every row."""
    if profile.rows is None:
        return True
    return profile.rows_without_target is not None and profile.rows_without_target * 2 >= profile.rows


def one_class_candidate(call: CriterionCall) -> bool:
    """Hard class targets, or per-sample binary ones, holding a single value."""
    profile = call.profile
    if profile is None or profile.distinct != 1:
        return False
    if call.function in ("cross_entropy", "nll_loss"):
        return call.hard_targets and (call.n_classes or 0) >= 2
    return call.function.startswith("binary") and profile.per_sample


def one_class_finding(call: CriterionCall, seen: int, batches: int, whole_epoch: bool) -> Finding | None:
    """TARGET_ONE_CLASS when ``seen`` targets over ``batches`` batches hold only one
    value: enough of them, or the whole epoch."""
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    if seen < (MIN_TARGETS if whole_epoch else ONE_CLASS_MIN_TARGETS):
        return None
    value = call.profile.only_value
    shown = f"{value:g}"
    of = (f" of the model's {call.n_classes} classes" if call.function in ("cross_entropy", "nll_loss")
          else " (a binary target)")
    where = "the whole epoch" if whole_epoch else f"the first {batches} batch(es)"
    dense = call.target_shape is not None and len(call.target_shape) >= 3 and value == 0 \
        and call.profile.total == call.profile.kept  # with ignored 255s beside the 0s, the mask was never divided
    mask = (" For label maps (a target per pixel) all 0: an integer mask converted with torchvision's "
            "ToTensor()/to_tensor, which divides uint8 images by 255, then cast with .long(), truncates every "
            "class id (1/255 ... 254/255) to 0" if dense else "")
    mask_fix = (" Convert masks without scaling: torch.from_numpy(np.array(mask)).long() or "
                "transforms.PILToTensor(), never ToTensor()." if dense else "")
    ignored = call.profile.total - call.profile.kept
    masked = (f" The only other value in the targets is the ignore_index {call.ignore_index} ({ignored} of "
              f"{call.profile.total} positions): a 0/{call.ignore_index} mask read as class ids with "
              f"ignore_index={call.ignore_index} ignores every foreground pixel, so only the background class is "
              "ever trained" if ignored and value == 0 and call.ignore_index is not None and call.ignore_index > 1
              else "")
    masked_fix = (f" For a 0/{call.ignore_index} mask, map it to class ids first: mask = (mask > 0).long() (or "
                  f"mask // {call.ignore_index}), and keep ignore_index for pixels that are truly unlabelled."
                  if masked else "")
    positives = call.function.startswith("binary") and value == 1
    implicit = (" For a log of interactions (clicks, purchases, views: implicit feedback) this is what the log "
                "holds, positives only: the model needs negatives, (user, item) pairs that did not interact, "
                "to learn what the user does not want" if positives else "")
    implicit_fix = (" For implicit feedback, sample negatives: for each observed (user, item) pair draw k items the "
                    "user did not interact with, labelled 0 (or use a pairwise BPR / sampled-softmax loss)."
                    if positives else "")
    thresholded = (" Binary labels derived from a column by a cut-off (y = column > 6.5) come out all 0 when the "
                   "column was standardised or scaled first: a cut-off in the column's raw units is never reached "
                   "by z-scores" if call.function.startswith("binary") and value == 0 and not ignored else "")
    thresholded_fix = (" For labels cut from a column, apply the threshold to the raw values before standardising "
                       "(or to the scaled cut-off, (6.5 - mean) / std)." if thresholded else "")
    return Finding(
        "TARGET_ONE_CLASS", "warning",
        f"every target is {shown}: all {seen} targets {call.function} got in {where}, one class{of}. A model "
        f"trained on one class learns to predict it whatever the input, with a loss that looks healthy.{mask}"
        f"{implicit}{masked}{thresholded}",
        "Check the labels the dataset returns: a label read from the wrong column or field, a constant "
        "placeholder, or data filtered down to one class; data sorted by class needs shuffle=True in the "
        "training DataLoader. With extremely imbalanced data, sample the minority class more "
        f"(WeightedRandomSampler) or weight it in the loss.{mask_fix}{implicit_fix}{masked_fix}{thresholded_fix}",
    )


def made_target_finding(call: CriterionCall) -> Finding | None:
    """TARGET_ONE_CLASS for a class target made inside the loss (no batch tensor holds it) that
    is 0 for every row of square (B, B) logits: the in-batch contrastive case, whose positives
    sit on the diagonal, scored with MoCo's torch.zeros target."""
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    shape = call.input.shape
    # Square scores that are a product of the batch's own embeddings need no more rows than a
    # small batch: their diagonal is the positive by construction. Other square scores may put
    # a positive first by design (cat([positive, negatives], 1)), so they need many rows.
    enough = IN_BATCH_MIN_TARGETS if call.similarity_product else ONE_CLASS_MIN_TARGETS // 4
    if call.function not in ("cross_entropy", "nll_loss") or len(shape) != 2 or call.profile is None \
            or call.profile.kept < enough:
        return None
    value = f"{call.profile.only_value:g}"
    if shape[0] == shape[1] and call.profile.only_value == 0:
        return Finding(
            "TARGET_ONE_CLASS", "warning",
            f"{call.function} gets ({shape[0]}, {shape[1]}) logits, the score of every sample against every "
            f"candidate of the batch, and a target made inside the loss that is {value} for every row: all "
            f"samples are trained to match candidate {value}, the first of the batch, and their own candidate on "
            "the diagonal is pushed away like a negative. torch.zeros(N) is MoCo's target, whose logits put the "
            "positive in column 0; for in-batch similarity logits the positives are on the diagonal",
            "Use the diagonal as the target: labels = torch.arange(logits.shape[0], device=logits.device) (and "
            "the same for the transposed logits of a symmetric CLIP loss).",
        )
    # Not square: a constant target is how MoCo-style logits (positive first, then a queue of
    # negatives) are scored by design.
    return None


def collapsed_target_finding(call: CriterionCall, batch: object) -> Finding | None:
    """TARGET_ONE_CLASS for a class target made inside the loss that is one value for every
    sample while the batch carries per-sample class ids with several values: the conversion
    from the labels to the target collapsed them (``y.argmax(1)`` of ``(B, 1)`` ids is always 0)."""
    from optimus_preflight.preflight.analyses.loss_findings import Finding
    from optimus_preflight.training.batches import leaves

    shape = call.input.shape
    if call.function not in ("cross_entropy", "nll_loss") or len(shape) != 2 or call.profile is None \
            or not call.n_classes or call.profile.kept < COLLAPSED_MIN_TARGETS:
        return None
    for leaf in leaves(batch):
        if not isinstance(leaf, torch.Tensor) or leaf.is_floating_point() or leaf.dtype == torch.bool \
                or leaf.dim() not in (1, 2) or leaf.shape[0] != shape[0] or (leaf.dim() == 2 and leaf.shape[1] != 1):
            continue
        values = leaf.detach().reshape(-1)
        distinct = int(values.unique().numel())
        # The ids must span the criterion's classes: MoCo's (B, 1 + queue) logits keep their
        # constant target beside dataset labels of another, much smaller range.
        if distinct >= 2 and int(values.min()) >= 0 and call.n_classes // 2 <= int(values.max()) < call.n_classes:
            size = "x".join(str(s) for s in leaf.shape)
            return Finding(
                "TARGET_ONE_CLASS", "warning",
                f"the batch carries ({size}) class ids with {distinct} different values, but the target "
                f"{call.function} gets is made inside the loss and is {call.profile.only_value:g} for every one of "
                f"its {call.profile.kept} samples: the conversion from labels to target collapses them (argmax over "
                "a size-1 dim, as y.argmax(1) of (B, 1) ids, is always 0; so is a max or a comparison taken over the "
                "wrong dim), and the model is trained to predict one class whatever the input",
                "Pass the class ids themselves: y.view(-1) (or y.squeeze(1)) for (B, 1) ids; argmax(dim=1) only "
                "converts one-hot (B, C) targets.",
            )
    return None
