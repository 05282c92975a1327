"""Feature columns that relate to the labels one way in training and another in validation (pure).

One-hot columns built per split (``pd.get_dummies`` or ``np.unique`` categories of each split),
a category -> id table fitted per split, columns selected or ordered per split: every column
keeps its range and frequency, so scale and distribution checks see nothing, yet column j
means one category in training and another in validation. What changes is how the column
relates to the label. For each column and class, the standardised mean difference between
the class and the rest (Cohen's d, with the rest and the spread weighted equally by class, so a
sampler that rebalances the classes moves nothing) is measured in both splits; under a random split the two
agree within their sampling error. A column "changed" when the two differ by more than
``Z`` standard errors and by at least ``MIN_CHANGE`` in d; the finding needs ``MIN_COLUMNS``
changed columns making up ``SHARE`` of the columns that carry the label in training. Drift
in time moves a few relations a little; a recoding reverses many.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from optimus_preflight.preflight.analyses.series import column_correlations

MAX_COLUMNS = 256  # tabular rows: per-column relations are not judged on pixels
MAX_CLASSES = 20
MIN_CLASS_ROWS = 16  # rows of a class (and of the rest) in each split before its d counts
CARRIES = 0.3  # |d| in training of a column that carries the label
Z = 4.5  # standard errors between the splits' d ...
MIN_CHANGE = 0.5  # ... and at least this much difference in d
MIN_COLUMNS = 2
SHARE = 0.25  # of the label-carrying columns


@dataclass(frozen=True)
class ChangedColumn:
    column: int
    label: int
    train_d: float
    val_d: float


@dataclass(frozen=True)
class RelationChange:
    carrying: int  # columns whose d in training reaches CARRIES
    changed: list[ChangedColumn]  # strongest first


@dataclass(frozen=True)
class ClassStats:
    """One split's per-class column means and row counts, and the within-class spread pooled
    with equal class weights (classes of two rows or more)."""
    means: dict[int, torch.Tensor]
    counts: dict[int, int]
    rows: int  # every row, of classes outside ``labels`` too
    spread: torch.Tensor


def _class_stats(x: torch.Tensor, y: torch.Tensor, labels: list[int]) -> ClassStats | None:
    rows = {c: x[y == c] for c in labels}
    present = [c for c in labels if rows[c].shape[0] >= 2]
    if len(present) < 2:
        return None
    spread = torch.stack([rows[c].var(0) for c in present]).mean(0).sqrt().clamp_min(1e-12)
    return ClassStats({c: rows[c].mean(0) for c in present}, {c: rows[c].shape[0] for c in labels}, int(y.shape[0]),
                      spread)


def _effects(stats: ClassStats | None, label: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(d per column, its standard error) of class ``label`` against the rest, both independent
    of the class mix: the rest is the unweighted mean of the other classes' means, over the
    pooled within-class spread. A sampler that rebalances the classes (or a split with another
    class mix) then moves no d; the total standard deviation and a row-weighted rest would both
    follow the mix."""
    if stats is None or label not in stats.means:
        return None
    n_in = stats.counts[label]
    n_out = stats.rows - n_in
    if n_in < MIN_CLASS_ROWS or n_out < MIN_CLASS_ROWS:
        return None
    rest = torch.stack([mean for c, mean in stats.means.items() if c != label]).mean(0)
    d = (stats.means[label] - rest) / stats.spread
    # Hedges & Olkin's standard error of d, which grows with d: over a tight within-class spread
    # well-separated classes have large d, and their sampling error is large with them.
    return d, (1 / n_in + 1 / n_out + d ** 2 / (2 * (n_in + n_out))) ** 0.5


def relation_change(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor,
                    val_y: torch.Tensor) -> RelationChange | None:
    """Columns whose relation to the labels differs between the splits beyond sampling error;
    None where nothing is judged or too few columns changed."""
    if train_x.dim() != 2 or val_x.dim() != 2 or train_x.shape[1] != val_x.shape[1] \
            or train_x.shape[1] > MAX_COLUMNS:
        return None
    if not bool(torch.isfinite(train_x).all()) or not bool(torch.isfinite(val_x).all()):
        return None
    labels = torch.unique(train_y).tolist()
    if not 2 <= len(labels) <= MAX_CLASSES:
        return None
    varying = (train_x.std(0) > 0) & (val_x.std(0) > 0)
    train_x, val_x = train_x.double(), val_x.double()
    carrying = torch.zeros(train_x.shape[1], dtype=torch.bool)
    best: dict[int, ChangedColumn] = {}
    train_stats, val_stats = _class_stats(train_x, train_y, labels), _class_stats(val_x, val_y, labels)
    for label in labels[1:] if len(labels) == 2 else labels:  # two classes: one contrast says it all
        train_effect, val_effect = _effects(train_stats, label), _effects(val_stats, label)
        if train_effect is None or val_effect is None:
            continue
        (t, t_se), (v, v_se) = train_effect, val_effect
        carrying |= varying & (t.abs() >= CARRIES)
        gap = (t - v).abs()
        changed = varying & (gap >= MIN_CHANGE) & (gap >= Z * (t_se ** 2 + v_se ** 2) ** 0.5) \
            & ((t.abs() >= CARRIES) | (v.abs() >= CARRIES))
        for column in torch.nonzero(changed).flatten().tolist():
            if column not in best or gap[column] > abs(best[column].train_d - best[column].val_d):
                best[column] = ChangedColumn(column, int(label), float(t[column]), float(v[column]))
    carried = int(carrying.sum())
    if len(best) < MIN_COLUMNS or len(best) < SHARE * max(carried, 1):
        return None
    changed = sorted(best.values(), key=lambda c: -abs(c.train_d - c.val_d))
    return RelationChange(carried, changed)


CARRIES_R = 0.15  # |correlation| with a regression target of a column that carries it
MIN_CHANGE_R = 0.25  # ... and at least this much difference in correlation between the splits


def regression_relation_change(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor,
                               val_y: torch.Tensor) -> RelationChange | None:
    """The same for one regression target, on 0/1 (one-hot) columns: each column's correlation
    with the target in both splits, compared on Fisher's z scale (standard error sqrt(1/(n1-3) + 1/(n2-3)));
    ``ChangedColumn`` holds the two correlations. None where nothing is judged or too few
    columns changed."""
    if train_y.dim() == 2 and train_y.shape[1] == 1:
        train_y, val_y = train_y[:, 0], val_y[:, 0]
    if train_x.dim() != 2 or val_x.dim() != 2 or train_x.shape[1] != val_x.shape[1] or train_y.dim() != 1 \
            or val_y.dim() != 1 or train_x.shape[1] > MAX_COLUMNS or len(train_y) != len(train_x) \
            or len(val_y) != len(val_x) or min(len(train_y), len(val_y)) < 4 * MIN_CLASS_ROWS:
        return None
    tensors = (train_x, train_y, val_x, val_y)
    if not all(bool(torch.isfinite(t).all()) for t in tensors) or float(train_y.std()) == 0 \
            or float(val_y.std()) == 0:
        return None

    varying = (train_x.std(0) > 0) & (val_x.std(0) > 0)
    # Only 0/1 (dummy) columns are judged: a continuous feature's relation to a target drifts
    # between a past and a later split (or between stations) without any recoding.
    varying &= ((train_x == 0) | (train_x == 1)).all(0) & ((val_x == 0) | (val_x == 1)).all(0)
    t, v = column_correlations(train_x, train_y), column_correlations(val_x, val_y)
    se = (1 / (len(train_y) - 3) + 1 / (len(val_y) - 3)) ** 0.5
    z_gap = (torch.atanh(t.clamp(-0.999, 0.999)) - torch.atanh(v.clamp(-0.999, 0.999))).abs()
    carrying = varying & (t.abs() >= CARRIES_R)
    changed = varying & (z_gap >= Z * se) & ((t - v).abs() >= MIN_CHANGE_R) & ((t.abs() >= CARRIES_R) | (v.abs() >= CARRIES_R))
    columns = torch.nonzero(changed).flatten().tolist()
    if len(columns) < MIN_COLUMNS or len(columns) < SHARE * max(int(carrying.sum()), 1):
        return None
    found = sorted((ChangedColumn(c, 0, float(t[c]), float(v[c])) for c in columns),
                   key=lambda c: -abs(c.train_d - c.val_d))
    return RelationChange(int(carrying.sum()), found)
