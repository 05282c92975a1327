"""Do the classes lie along one direction of the inputs, as numbered targets must? (pure)

Class ids regressed as numbers (``MSELoss`` on ``y.float()`` with one output, rounded at
prediction time) only work for ordinal targets: ratings, grades, counts, severity levels,
where the classes follow one another along one direction of the inputs. Nominal classes
(land-use types, species, intents) differ from each other in several independent ways, so
one output is asked to put "forest" between "water" and "urban" because their ids are 1, 2
and 3, and lands between classes.

Read from the inputs: a ridge probe predicts each class's membership (one-hot, two folds).
For any scoring ``v`` of the classes, the variance a linear regression of ``Y v`` explains
follows from those predictions (regressing ``Y v`` gives ``P v``), so the best scorings are
the generalised eigenvectors of (explained, total): canonical correlations between the
inputs and the classes. Ordinal classes have one large eigenvalue and the rest near zero,
whatever the noise or a monotone non-linearity; nominal classes have several of similar
size. Only classes the inputs tell apart linearly are judged; otherwise nothing is said.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from optimus_preflight.preflight.analyses.label_signal import ridge_out_of_fold, standardised

MIN_SAMPLES = 256
MIN_CLASSES, MAX_CLASSES = 3, 12
MIN_CLASS_ROWS = 8
MAX_FEATURES = 256
PROJECTED = 128
SEPARABLE = 0.25  # the probe's accuracy above the largest class's share
SECOND = 0.2  # the second direction's explained variance, at least ...
SECOND_SHARE = 0.4  # ... and this share of the first's


@dataclass(frozen=True)
class ClassNumbering:
    classes: list[float]  # the target values, sorted
    samples: int
    accuracy: float  # the one-hot probe's
    majority: float
    ids_r2: float  # variance a linear regression on the ids explains
    directions: list[float]  # explained variance of the best scorings, largest first

    @property
    def nominal(self) -> bool:
        first, second = self.directions[0], self.directions[1]
        return self.accuracy >= self.majority + SEPARABLE and second >= SECOND and second >= SECOND_SHARE * first


def class_numbering(features: torch.Tensor, targets: torch.Tensor) -> ClassNumbering | None:
    """How the classes of integer-valued targets (N,) spread over the linear directions of
    ``features`` (N, D); None where it is not judged."""
    if features.dim() != 2 or targets.dim() != 1 or len(features) != len(targets) or len(targets) < MIN_SAMPLES:
        return None
    y = targets.double()
    if not bool(torch.isfinite(y).all()) or not bool((y == y.round()).all()):
        return None
    values, y_index = torch.unique(y, return_inverse=True)
    classes = len(values)
    if not MIN_CLASSES <= classes <= MAX_CLASSES or int(torch.bincount(y_index).min()) < MIN_CLASS_ROWS:
        return None
    x = standardised(features)
    if x is None:
        return None
    if x.shape[1] > MAX_FEATURES:
        x = x @ torch.randn(x.shape[1], PROJECTED, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))  # folds free of any sorting
    x, y_index = x[order], y_index[order]
    onehot = torch.nn.functional.one_hot(y_index, classes).double()
    predicted = ridge_out_of_fold(x, onehot)
    residual = (onehot - predicted).T @ (onehot - predicted)
    centred = onehot - onehot.mean(0)
    total = centred.T @ centred
    # One class's column is the others' complement: drop it so the total is invertible.
    lower = torch.linalg.cholesky(total[:-1, :-1])
    inverse = torch.linalg.inv(lower)
    explained = inverse @ (total[:-1, :-1] - residual[:-1, :-1]) @ inverse.T
    directions = torch.linalg.eigvalsh((explained + explained.T) / 2).flip(0)
    ids = values - values.mean()
    ids_r2 = float(1 - (ids @ residual @ ids) / (ids @ total @ ids))
    accuracy = float((predicted.argmax(1) == y_index).double().mean())
    majority = float(torch.bincount(y_index).max()) / len(y_index)
    return ClassNumbering([float(v) for v in values], len(y_index), accuracy, majority, ids_r2,
                          [float(d) for d in directions])
