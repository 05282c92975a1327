"""A per-sample statistic that gives the label away in training only (``TRAIN_ONLY_SHORTCUT``).

Preprocessing applied to the training rows of one class (noise added to the oversampled
minority copies, augmentation or resampling of one class's files, another source's scale
for one label) leaves that class with its own noise level, scale or roughness. A model
learns that shortcut first: it separates the training labels perfectly and means nothing
on validation, where the class looks like the others.

Measured on the rows ``data.split_labels`` reads: for every class against the rest, the
rank AUC of four per-sample statistics (standard deviation, norm, mean absolute difference
of neighbouring values, largest absolute value) on training and on validation. A statistic
that separates a class well in training and much less in validation is a
shortcut made in the training data. A class that really differs in that statistic does so
in both splits and stays quiet.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TRAIN_SEPARATION = 0.85  # AUC in training (either direction)
VAL_DROP = 0.25  # validation AUC at least this much lower, in the same direction
MIN_CLASS = 30  # samples of the class (and of the rest) in each split: the AUC then varies by ~0.05
MIN_FEATURES = 4  # values per sample before a per-sample statistic means anything


@dataclass(frozen=True)
class Shortcut:
    label: int
    statistic: str
    train_auc: float  # oriented: the class above the rest
    val_auc: float
    higher: bool  # the class has the larger statistic in training


def per_sample_statistics(features: torch.Tensor) -> dict[str, torch.Tensor]:
    values = features.float()
    return {
        "standard deviation": values.std(dim=1),
        "norm": values.norm(dim=1),
        "mean absolute difference between neighbouring values": (values[:, 1:] - values[:, :-1]).abs().mean(dim=1),
        "largest absolute value": values.abs().amax(dim=1),
    }


def rank_auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """P(score of a positive > score of a negative), ties counted half (Mann-Whitney)."""
    order = scores.argsort()
    ranks = torch.empty_like(scores, dtype=torch.float64)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    # average the ranks of ties
    unique, inverse = torch.unique(scores, return_inverse=True)
    if len(unique) < len(scores):
        sums = torch.zeros(len(unique), dtype=torch.float64).index_add_(0, inverse, ranks)
        counts = torch.zeros(len(unique), dtype=torch.float64).index_add_(0, inverse, torch.ones_like(ranks))
        ranks = (sums / counts)[inverse]
    n_pos = int(positive.sum())
    n_neg = len(scores) - n_pos
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def train_only_shortcut(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor,
                        val_y: torch.Tensor) -> Shortcut | None:
    """The strongest training-only shortcut of (features (N, D), labels (N,)) splits, or None."""
    if train_x.shape[1] < MIN_FEATURES or val_x.shape[1] != train_x.shape[1]:
        return None
    train_stats, val_stats = per_sample_statistics(train_x), per_sample_statistics(val_x)
    best: Shortcut | None = None
    for label in torch.unique(train_y).tolist():
        in_train, in_val = train_y == label, val_y == label
        if min(int(in_train.sum()), int((~in_train).sum()), int(in_val.sum()), int((~in_val).sum())) < MIN_CLASS:
            continue
        for name, scores in train_stats.items():
            auc = rank_auc(scores, in_train)
            higher = auc >= 0.5
            oriented = auc if higher else 1 - auc
            if oriented < TRAIN_SEPARATION:
                continue
            val_auc = rank_auc(val_stats[name], in_val)
            val_oriented = val_auc if higher else 1 - val_auc
            if val_oriented > oriented - VAL_DROP:
                continue
            # Two classes mirror each other: the one the statistic is larger for (noise adds) is named.
            rank = (round(oriented - val_oriented, 9), higher)
            if best is None or rank > (round(best.train_auc - best.val_auc, 9), best.higher):
                best = Shortcut(int(label), name, oriented, val_oriented, higher)
    return best
