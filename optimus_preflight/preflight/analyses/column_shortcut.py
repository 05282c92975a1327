"""A feature column that predicts the label in training and much less in validation.

A target (mean) encoding computed on the whole training table, each row's own label
included, a feature filled from the label for the training rows only (an imputation by
class mean, a "days until the event" known only in hindsight), or a column scaled per class
before the split: the column tells the training labels apart and the model leans on it,
while in validation, where the column was built without the label, it says far less.
Nothing in one batch shows it; the two splits side by side do.

For binary labels (0 / 1 floats included), the rank AUC of each column for the positive class;
for continuous labels, each column's Spearman correlation with the label. A genuinely
predictive column predicts in both splits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from optimus_preflight.preflight.analyses.series import column_correlations
from optimus_preflight.preflight.analyses.train_shortcut import rank_auc

TRAIN_AUC = 0.85  # oriented AUC of the column in training
AUC_DROP = 0.25  # and this much lower in validation, same orientation
TRAIN_CORRELATION = 0.8  # |Spearman| of the column with a continuous label in training
CORRELATION_DROP = 0.35
# The column's link vanishes in validation (near chance), it is not reversed: a reversed
# link is the labels recoded between the splits, which data.split_labels names.
VANISHED = 0.35
VANISHED_CORRELATION = 0.3
OTHER_PREDICTIVE = 0.6  # other columns this predictive in training ...
OTHERS_DROP = 0.1  # ... keep their AUC in validation within this (median)
MIN_CLASS_ROWS = 30  # rows of the class, and of the rest, in each split
MIN_ROWS = 100  # rows of each split for a continuous label
MAX_COLUMNS = 512
MAX_CLASSES = 20  # integer-valued float labels with more values are a continuous target


@dataclass(frozen=True)
class ColumnShortcut:
    column: int
    measure: str  # "AUC for class 1" / "Spearman correlation"
    train: float
    val: float


def _ranks(values: torch.Tensor) -> torch.Tensor:
    order = values.argsort()
    ranks = torch.empty_like(values, dtype=torch.float64)
    ranks[order] = torch.arange(len(values), dtype=torch.float64)
    return ranks


def _spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(column_correlations(_ranks(x)[:, None], _ranks(y))[0])


def _others_hold(tx: torch.Tensor, vx: torch.Tensor, in_train: torch.Tensor, in_val: torch.Tensor,
                 column: int) -> bool:
    """Whether other columns predict the class in training and still do in validation: when
    they fall too, the labels changed meaning between the splits (recoded, drawn from a few
    rows), not one column; with no other predictive column the two cannot be told apart."""
    drops = []
    for other in range(tx.shape[1]):
        if other == column:
            continue
        auc = rank_auc(tx[:, other], in_train)
        higher = auc >= 0.5
        train = auc if higher else 1 - auc
        if train < OTHER_PREDICTIVE:
            continue
        val_auc = rank_auc(vx[:, other], in_val)
        drops.append(train - (val_auc if higher else 1 - val_auc))
    return bool(drops) and float(torch.tensor(drops).median()) <= OTHERS_DROP


def _is_class_labels(labels: torch.Tensor) -> bool:
    if not labels.is_floating_point():
        return True
    return bool((labels == labels.round()).all()) and len(torch.unique(labels)) <= MAX_CLASSES


def train_only_column(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor,
                      val_y: torch.Tensor) -> ColumnShortcut | None:
    """The column whose link to the label falls the most from training to validation, or None."""
    if train_x.dim() != 2 or val_x.dim() != 2 or train_x.shape[1] != val_x.shape[1] or train_x.shape[1] > MAX_COLUMNS:
        return None
    tx, vx = train_x.detach().double().cpu(), val_x.detach().double().cpu()
    ty, vy = train_y.detach().double().cpu(), val_y.detach().double().cpu()
    best: ColumnShortcut | None = None
    if _is_class_labels(train_y) and _is_class_labels(val_y):
        classes = torch.unique(ty).tolist()
        # Binary labels only: with many classes, a drop in one class's columns is as often the
        # validation labels numbered another way (data.split_labels' finding) as a leak.
        if len(classes) != 2:
            return None
        for label in classes[1:]:
            in_train, in_val = ty == label, vy == label
            if min(int(in_train.sum()), int((~in_train).sum()), int(in_val.sum()), int((~in_val).sum())) < MIN_CLASS_ROWS:
                continue
            for column in range(tx.shape[1]):
                auc = rank_auc(tx[:, column], in_train)
                higher = auc >= 0.5
                train = auc if higher else 1 - auc
                if train < TRAIN_AUC:
                    continue
                val_auc = rank_auc(vx[:, column], in_val)
                val = val_auc if higher else 1 - val_auc
                if val <= train - AUC_DROP and val >= VANISHED and (best is None or train - val > best.train - best.val):
                    if _others_hold(tx, vx, in_train, in_val, column):
                        best = ColumnShortcut(column, f"AUC for class {label:g}", train, val)
        return best
    if len(ty) < MIN_ROWS or len(vy) < MIN_ROWS:
        return None
    for column in range(tx.shape[1]):
        train = _spearman(tx[:, column], ty)
        if abs(train) < TRAIN_CORRELATION:
            continue
        val = _spearman(vx[:, column], vy) * (1 if train > 0 else -1)
        if val <= abs(train) - CORRELATION_DROP and val >= -VANISHED_CORRELATION and \
                (best is None or abs(train) - val > best.train - best.val):
            best = ColumnShortcut(column, "Spearman correlation", abs(train), val)
    return best
