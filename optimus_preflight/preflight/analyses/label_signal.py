"""Do the inputs say anything about the labels? (pure, on tensors read from the loader)

Features and labels that were filtered, shuffled or sliced apart (``X = X[mask]`` without
``y = y[mask]``, ``y[1:]`` against ``X[:-1]``, one array sorted on its own) keep every
shape, dtype and range; the model simply has nothing to learn. Two predictors that need no
training loop look for any relation: a 5-nearest-neighbour vote (left-one-out, local and
non-linear) and a ridge-regression linear probe (two folds, global and sparse-tolerant).
When neither beats always answering the largest class, the labels are unrelated to the
inputs the model sees. Real tasks with a weak signal still beat it by a few points at 512
samples or more; only float features of at most 256 values (tabular rows, short windows) are
judged, where both predictors are reliable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MIN_SAMPLES = 512
MAX_FEATURES = 256
MAX_CLASSES = 20
NEIGHBOURS = 5
RIDGE = 1.0
CHANCE_SPREAD = 2.5  # binomial standard deviations of an accuracy that chance reaches
MARGIN = 0.02  # above the majority share: what either predictor must reach for the labels to be related
# Above this share of the largest class both predictors answer it almost always, signal or not.
MAX_MAJORITY = 0.7


@dataclass(frozen=True)
class LabelSignal:
    samples: int
    classes: int
    majority: float  # share of the largest class
    neighbour_accuracy: float
    linear_accuracy: float

    @property
    def unrelated(self) -> bool:
        # The better of two predictors on chance labels beats the majority share by sampling noise
        # alone: about 2.5 binomial standard deviations of an accuracy over these samples.
        noise = CHANCE_SPREAD * math.sqrt(self.majority * (1 - self.majority) / max(self.samples, 1))
        return max(self.neighbour_accuracy, self.linear_accuracy) <= self.majority + max(MARGIN, noise)


def _neighbour_vote(x: torch.Tensor, y: torch.Tensor, classes: int) -> float:
    distances = torch.cdist(x, x)
    distances.fill_diagonal_(float("inf"))
    nearest = distances.topk(NEIGHBOURS, largest=False).indices
    votes = torch.nn.functional.one_hot(y[nearest], classes).sum(1).float()
    votes += 1e-3 * torch.nn.functional.one_hot(y[nearest[:, 0]], classes)  # ties go to the nearest
    return float((votes.argmax(1) == y).float().mean())


def ridge_out_of_fold(x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Two-fold ridge predictions of ``targets`` (N, k) from ``x`` (N, d) plus a bias: each half
    predicted by the fit on the other half."""
    x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    half = len(x) // 2
    predicted = torch.empty(len(x), targets.shape[1], dtype=x.dtype)
    for fit, test in ((slice(0, half), slice(half, None)), (slice(half, None), slice(0, half))):
        gram = x[fit].T @ x[fit] + RIDGE * torch.eye(x.shape[1], dtype=x.dtype)
        predicted[test] = x[test] @ torch.linalg.solve(gram, x[fit].T @ targets[fit].to(x.dtype))
    return predicted


def _linear_probe(x: torch.Tensor, y: torch.Tensor, classes: int) -> float:
    scores = ridge_out_of_fold(x, torch.nn.functional.one_hot(y, classes))
    return float((scores.argmax(1) == y).float().mean())


def standardised(features: torch.Tensor) -> torch.Tensor | None:
    """(N, D) features as float64, constant columns dropped and the rest standardised; None when
    a value is not finite or every column is constant."""
    x = features.double()
    if not bool(torch.isfinite(x).all()):
        return None
    spread = x.std(0)
    if bool((spread == 0).all()):
        return None
    return (x[:, spread > 0] - x[:, spread > 0].mean(0)) / spread[spread > 0]


def label_signal(features: torch.Tensor, labels: torch.Tensor) -> LabelSignal | None:
    """How well the inputs predict the labels, or None where this is not judged (too few
    samples, wide or constant features, one class or too many)."""
    if features.dim() != 2 or len(features) < MIN_SAMPLES or features.shape[1] > MAX_FEATURES:
        return None
    x = standardised(features)
    if x is None:
        return None
    values, y = torch.unique(labels, return_inverse=True)
    classes = len(values)
    if not 2 <= classes <= MAX_CLASSES:
        return None
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))  # folds free of any sorting
    x, y = x[order], y[order]
    majority = float(torch.bincount(y).max()) / len(y)
    if majority > MAX_MAJORITY:
        return None
    return LabelSignal(len(y), classes, majority, _neighbour_vote(x, y, classes), _linear_probe(x, y, classes))


MAX_LABELS = 8  # columns of multi-hot targets judged, the most balanced first


def multi_label_signal(features: torch.Tensor, targets: torch.Tensor) -> list[LabelSignal] | None:
    """``label_signal`` of each label of (N, L) 0/1 multi-hot targets (L >= 2) balanced enough to
    judge, the most balanced first; None when fewer than two can be judged."""
    if targets.dim() != 2 or targets.shape[1] < 2 or not bool(((targets == 0) | (targets == 1)).all()):
        return None
    rates = targets.float().mean(0)
    order = (rates - 0.5).abs().argsort()[:MAX_LABELS]
    judged = [signal for column in order.tolist()
              if (signal := label_signal(features, targets[:, column].long())) is not None]
    return judged if len(judged) >= 2 else None


@dataclass(frozen=True)
class TargetSignal:
    samples: int
    targets: int  # columns
    neighbour_r2: float  # leave-one-out 5-nearest-neighbour mean, averaged over the columns
    linear_r2: float  # two-fold ridge

    @property
    def unrelated(self) -> bool:
        return max(self.neighbour_r2, self.linear_r2) <= R2_MARGIN


R2_MARGIN = 0.02  # explained variance either predictor must beat for regression targets to be related
MAX_TARGETS = 8


def _r2(predicted: torch.Tensor, actual: torch.Tensor) -> float:
    residual = ((predicted - actual) ** 2).sum(0)
    total = ((actual - actual.mean(0)) ** 2).sum(0).clamp_min(1e-12)
    return float((1 - residual / total).mean())


def target_signal(features: torch.Tensor, targets: torch.Tensor) -> TargetSignal | None:
    """How well the inputs predict float regression targets (N, k): a neighbour average and a
    ridge probe, as ``label_signal`` does for classes; None where this is not judged."""
    if features.dim() != 2 or len(features) < MIN_SAMPLES or features.shape[1] > MAX_FEATURES:
        return None
    y = targets.double().reshape(len(targets), -1)
    if y.shape[1] > MAX_TARGETS or len(y) != len(features):
        return None
    x = features.double()
    if not bool(torch.isfinite(x).all()) or not bool(torch.isfinite(y).all()):
        return None
    spread, target_spread = x.std(0), y.std(0)
    if bool((spread == 0).all()) or bool((target_spread == 0).any()):
        return None
    if any(int(torch.unique(column).numel()) <= MAX_CLASSES for column in y.T):
        return None  # few distinct values: classes or counts, the label probe's business
    x = (x[:, spread > 0] - x[:, spread > 0].mean(0)) / spread[spread > 0]
    y = (y - y.mean(0)) / target_spread
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    distances = torch.cdist(x, x)
    distances.fill_diagonal_(float("inf"))
    nearest = distances.topk(NEIGHBOURS, largest=False).indices
    neighbour = _r2(y[nearest].mean(1), y)
    return TargetSignal(len(y), y.shape[1], neighbour, _r2(ridge_out_of_fold(x, y), y))
