"""Class weights that favour the frequent classes: the counts where their inverse was meant.

``CrossEntropyLoss(weight=counts / counts.sum())`` or ``BCEWithLogitsLoss(pos_weight=
pos / neg)`` read as balancing, but they weight each class by how often it already occurs
(or the rare positives by less than 1): the imbalance is amplified, and the rare classes
are all but ignored. Judged on the targets the criterion gets: the weights must rise with
the class frequencies across the classes present, over a real spread of both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_TARGETS = 32
SPREAD = 2.0  # max/min of both the weights and the frequencies of the classes present
RANK_AGREEMENT = 0.9  # Spearman correlation of weights and frequencies
RARE_POSITIVES = 0.3  # positive share under which pos_weight < 1 down-weights the rare class
LOW_POS_WEIGHT = 0.5


@dataclass
class FrequentClassWeights:
    function: str
    classes: int  # present in the targets
    spread: float  # of the weights, max/min
    detail: str
    permuted: bool = False  # inverse frequencies, each on another class's id


PERMUTED_SLACK = 2.0  # max/min of weight x frequency when the sorted weights meet the sorted frequencies
PERMUTED_SPREAD = 4.0  # ... and at least this by class id


def _ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks with ties given their average rank: two rare classes seen once each in a batch
    are tied, not ordered by chance."""
    order = values.argsort().argsort().double()
    ranks = order.clone()
    for value in values.unique():
        tied = values == value
        ranks[tied] = order[tied].mean()
    return ranks


def weights_follow_counts(weight: torch.Tensor, target: torch.Tensor,
                          ignore_index: int | None) -> FrequentClassWeights | None:
    """For a class criterion's ``weight`` (C,) and hard targets (pure)."""
    labels = target.detach().reshape(-1).long().cpu()
    if ignore_index is not None:
        labels = labels[labels != ignore_index]
    w = weight.detach().double().cpu().reshape(-1)
    if labels.numel() < MIN_TARGETS or labels.min() < 0 or labels.max() >= w.numel():
        return None
    counts = torch.bincount(labels, minlength=w.numel()).double()
    present = counts > 0
    if int(present.sum()) < 2 or float(w[present].min()) <= 0:
        return None
    c, wp = counts[present], w[present]
    if float(c.max() / c.min()) < SPREAD or float(wp.max() / wp.min()) < SPREAD:
        return None
    permuted = _permuted_inverse(c, wp, present, labels.numel())
    if permuted is not None:
        return permuted
    if int(present.sum()) == 2:
        agree = 1.0 if bool(c.argmax() == wp.argmax()) else -1.0
    else:
        rc, rw = _ranks(c), _ranks(wp)
        agree = float(torch.corrcoef(torch.stack([rc, rw]))[0, 1])
    if agree < RANK_AGREEMENT:
        return None
    frequent, rare = int(c.argmax()), int(c.argmin())
    ids = present.nonzero().flatten()
    detail = (f"class {int(ids[frequent])} ({int(c[frequent])} of {labels.numel()} targets) weighs "
              f"{float(wp[frequent]):.3g} and class {int(ids[rare])} ({int(c[rare])}) weighs {float(wp[rare]):.3g}")
    return FrequentClassWeights("cross_entropy", int(present.sum()), float(wp.max() / wp.min()), detail)


def _permuted_inverse(c: torch.Tensor, wp: torch.Tensor, present: torch.Tensor,
                      targets: int) -> FrequentClassWeights | None:
    """Weights that are the classes' inverse frequencies, each on another class's id: the
    largest weight meets the smallest count once both are sorted (weight x count nearly
    constant), yet not by class id (a list built in value_counts / most_common order and
    indexed by class id)."""
    if int(present.sum()) < 3:
        return None
    matched = wp.sort().values * c.sort(descending=True).values
    by_id = wp * c
    if float(matched.max() / matched.min()) > PERMUTED_SLACK or float(by_id.max() / by_id.min()) < PERMUTED_SPREAD:
        return None
    ids = present.nonzero().flatten()
    listed = "; ".join(f"class {int(ids[i])}: {int(c[i])} targets, weight {float(wp[i]):.3g}"
                       for i in range(min(len(ids), 6)))
    detail = (f"sorted, the weights are the inverse class frequencies of the batch's {targets} targets (weight x count "
              f"within {float(matched.max() / matched.min()):.2g}x), but by class id they are not ({listed}: weight "
              f"x count ranges {float(by_id.min()):.3g} to {float(by_id.max()):.3g})")
    return FrequentClassWeights("cross_entropy", int(present.sum()), float(wp.max() / wp.min()), detail, permuted=True)


def pos_weight_down_weights_positives(pos_weight: torch.Tensor, target: torch.Tensor) -> FrequentClassWeights | None:
    """For ``binary_cross_entropy_with_logits(pos_weight=...)`` and 0/1 targets (pure)."""
    values = target.detach().float().reshape(-1).cpu()
    if values.numel() < MIN_TARGETS or not bool(((values == 0) | (values == 1)).all()):
        return None
    share = float(values.mean())
    weight = float(pos_weight.detach().float().mean())
    if share < RARE_POSITIVES and 0 < weight <= LOW_POS_WEIGHT:  # no positive in the batch: rarer still
        return FrequentClassWeights(
            "binary_cross_entropy_with_logits", 2, 1 / weight,
            f"positives are {share:.0%} of the targets and pos_weight is {weight:.3g} (about positives / negatives; "
            + (f"negatives / positives is {(1 - share) / share:.3g})" if share > 0 else
               f"the batch of {values.numel()} holds no positive at all)"))
    return None


BALANCED_BATCH = 2.0  # max/min class count in a batch the sampler has balanced
UNEQUAL_WEIGHTS = 3.0  # max/min class weight of a criterion that balances again


@dataclass
class WeightsOnBalancedBatch:
    function: str
    spread: float  # the weights' max/min over the classes present
    counts: str  # the batch's class counts, shown


def weights_on_balanced_batch(function: str, weight: torch.Tensor, target: torch.Tensor,
                              ignore_index: int | None) -> WeightsOnBalancedBatch | None:
    """Class weights far apart on a batch whose classes are about equally frequent (pure):
    the batch was balanced already, by a sampler, and the weights balance it again."""
    labels = target.detach().reshape(-1).long().cpu()
    if ignore_index is not None:
        labels = labels[labels != ignore_index]
    w = weight.detach().double().cpu().reshape(-1)
    if function == "binary_cross_entropy_with_logits":
        if w.numel() != 1 or not bool(((labels == 0) | (labels == 1)).all()):
            return None
        w = torch.cat([torch.ones(1, dtype=w.dtype), w])  # negatives weigh 1, positives pos_weight
    if labels.numel() < MIN_TARGETS or int(labels.min()) < 0 or int(labels.max()) >= w.numel():
        return None
    counts = torch.bincount(labels, minlength=w.numel()).double()
    present = counts > 0
    if int(present.sum()) < 2 or float(w[present].min()) <= 0:
        return None
    c, wp = counts[present], w[present]
    spread = float(wp.max() / wp.min())
    if float(c.max() / c.min()) > BALANCED_BATCH or spread < UNEQUAL_WEIGHTS:
        return None
    ids = present.nonzero().flatten().tolist()
    shown = ", ".join(f"class {i}: {int(n)}" for i, n in zip(ids[:6], c.tolist(), strict=False))
    return WeightsOnBalancedBatch(function, spread, shown)
