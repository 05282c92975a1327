"""Regression targets the inputs say nothing about (``data.target_signal``).

``TARGETS_UNRELATED``: float targets that neither a 5-nearest-neighbour average nor a ridge
probe can predict from the inputs (explained variance at most 2%), over up to 2048 training
samples of an ``(x, y)`` batch with at most 256 input values per sample. The regression
twin of ``LABELS_UNRELATED``: rows of the targets and of the inputs filtered, shuffled or
sorted apart, or a target transform that scrambles neighbouring values. For ``(B, 2)``
targets on the unit circle (sin, cos of an angle), an angle given in degrees to
``torch.sin``/``torch.cos``, which take radians, is named: it wraps ~57 times over the
compass, so neighbouring directions get unrelated targets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.label_signal import MAX_FEATURES, multi_label_signal, target_signal
from optimus_preflight.preflight.analyses.sample_scaling import sample_normalisation
from optimus_preflight.preflight.analyses.series import lag_one
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.row_scaling import rows_standardised
from optimus_preflight.preflight.checks.split_scale import inputs_beside_labels
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SAMPLES = 2048
SCAN_BUDGET_S = 2.0
UNIT_CIRCLE = 0.01  # |sin^2 + cos^2 - 1| of every target row


def features_and_targets(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(features (B, D) float, targets (B, k) float) of an ``(x, y)`` tuple batch with float
    regression targets; None otherwise."""
    if not isinstance(batch, (list, tuple)) or len(batch) != 2:
        return None
    x, y = batch
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or not (x.is_floating_point()
                                                                                 and y.is_floating_point()):
        return None
    if x.dim() < 2 or y.dim() not in (1, 2) or len(x) != len(y):
        return None
    flat = x.detach().reshape(len(x), -1)
    targets = y.detach().reshape(len(y), -1).float().cpu()
    if flat.shape[1] > MAX_FEATURES or soft_labels(targets):
        return None
    return flat.float().cpu(), targets


def survival_times(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(features (B, D), log times (B, 1)) of an ``(x, time, event)`` survival batch: positive
    float times beside a 0/1 event indicator."""
    if not isinstance(batch, (list, tuple)) or len(batch) != 3:
        return None
    x, time, event = batch
    if not all(isinstance(t, torch.Tensor) for t in batch) or not (x.is_floating_point() and time.is_floating_point()):
        return None
    if x.dim() < 2 or time.dim() != 1 or event.dim() != 1 or not len(x) == len(time) == len(event):
        return None
    flat = x.detach().reshape(len(x), -1)
    if flat.shape[1] > MAX_FEATURES or bool((time <= 0).any()) or not bool(((event == 0) | (event == 1)).all()):
        return None
    return flat.float().cpu(), time.detach().float().log().reshape(-1, 1).cpu()


def soft_labels(targets: torch.Tensor) -> bool:
    """Rows of non-negative values summing to 1: class probabilities (mixup, label smoothing,
    distillation), not regression targets."""
    return targets.shape[1] > 1 and bool((targets >= 0).all()) and bool(((targets.sum(1) - 1).abs() < 1e-3).all())


def on_unit_circle(targets: torch.Tensor) -> bool:
    return targets.shape[1] == 2 and bool(((targets.pow(2).sum(1) - 1).abs() < UNIT_CIRCLE).all())


WINDOW_PAIRS = 6  # consecutive dataset items compared for the sliding-window overlap
MIN_WINDOW = 8
SMOOTH = 0.15  # |lag-1 correlation| inside windows at or below this: the values follow no order


def shuffled_series(ctx: PreflightContext, findings: Findings, check: str, features: torch.Tensor) -> float | None:
    """The lag-1 correlation inside the windows, when the training dataset's items are sliding
    windows of one series (item i + 1's window is item i's moved by one step) whose values
    follow no order: a series shuffled row by row before it was windowed; None otherwise."""
    from optimus_preflight.preflight.data_access.guard import DataGuard

    if features.shape[1] < MIN_WINDOW:
        return None
    correlation = lag_one(features, 1)
    dataset = getattr(ctx.train_loader, "dataset", None)
    if abs(correlation) > SMOOTH or dataset is None or not hasattr(dataset, "__len__") \
            or not hasattr(dataset, "__getitem__"):
        return None
    guard = DataGuard(ctx, check, findings)
    size = guard.call(len, dataset, what="len(dataset)")
    if size < 2 * WINDOW_PAIRS:
        return None
    items = [guard.call(dataset.__getitem__, i, what=f"dataset[{i}]") for i in range(WINDOW_PAIRS + 1)]
    windows = [item[0] if isinstance(item, (tuple, list)) else None for item in items]
    if any(not isinstance(w, torch.Tensor) or w.dim() != 1 or w.numel() < MIN_WINDOW for w in windows):
        return None
    overlapping = all(torch.equal(a[1:], b[:-1]) for a, b in zip(windows, windows[1:], strict=False))
    return correlation if overlapping else None


class TargetSignalCheck(Check):
    """TARGETS_UNRELATED: float regression targets no predictor reads from the inputs."""

    name = "data.target_signal"
    stage = Stage.DATA
    codes = ("TARGETS_UNRELATED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        survival = features_and_targets(ctx.artifacts.first_batch) is None
        if survival and survival_times(ctx.artifacts.first_batch) is None:
            findings.data["summary"] = "not an (inputs, float targets) batch"
            return
        parts = read_samples(ctx, self.name, findings, ctx.train_loader, f"training targets for {self.name}",
                             survival_times if survival else features_and_targets, SAMPLES, SCAN_BUDGET_S)
        if not parts or len({x.shape[1] for x, _ in parts}) != 1 or len({y.shape[1] for _, y in parts}) != 1:
            return
        xs, ys = [x for x, _ in parts], [y for _, y in parts]
        features, targets = torch.cat(xs)[:SAMPLES], torch.cat(ys)[:SAMPLES]
        signal = target_signal(features, targets)
        if signal is None:
            self._multi_label(features, targets, findings)
            return
        findings.data.update(neighbour_r2=round(signal.neighbour_r2, 3), linear_r2=round(signal.linear_r2, 3),
                             samples=signal.samples)
        findings.data["summary"] = (f"targets explained {max(signal.neighbour_r2, signal.linear_r2):.0%} by the "
                                    f"inputs over {signal.samples} samples")
        if not signal.unrelated:
            return
        order = None if on_unit_circle(targets) or survival else shuffled_series(ctx, findings, self.name, features)
        if survival:
            why = ("the (log) survival times look unrelated to the covariates: durations and event flags sorted or "
                   "shuffled apart from the feature rows (df.sort_values('time') applied to the times and events only, "
                   "or the features kept in their original order), so each subject is paired with another's "
                   "outcome; a Cox or hazard model then has nothing to rank by")
            fix = ("Sort, filter and shuffle the features, times and events together (one permutation or one "
                   "DataFrame for all three), and sort by time inside the loss where the Cox risk sets need it.")
        elif on_unit_circle(targets):
            why = ("the targets are (sin, cos) pairs of an angle (every row on the unit circle), and samples with "
                   "nearly the same inputs get unrelated angles: the angle was most likely given in degrees to "
                   "torch.sin / torch.cos, which take radians, so 0-360 degrees wrap around ~57 times and neighbouring "
                   "directions get unrelated targets (else inputs and targets were shuffled or filtered apart)")
            fix = ("Convert before encoding: torch.sin(torch.deg2rad(angle)), torch.cos(torch.deg2rad(angle)); and "
                   "check that inputs and targets are filtered and shuffled together.")
        elif order is not None:
            why = (f"the inputs are sliding windows of one series (each sample's window is the previous one moved by "
                   f"one step), but neighbouring values inside a window are uncorrelated (lag-1 correlation "
                   f"{order:+.2f}; a real series is smooth from one step to the next): the rows were shuffled before "
                   "the windows were cut (df.sample(frac=1), series[randperm(n)], a shuffled train_test_split), so "
                   "each window is random time steps, its target an unrelated one, and the temporal order the "
                   "forecaster needs is gone")
            fix = ("Cut the windows from the series in time order first, then shuffle (or split) the windows, never the "
                   "rows: windows = [series[i:i + width] for i in range(len(series) - width)]; for validation, split "
                   "by time.")
        elif (erased := sample_normalisation(first_inputs(ctx))) is not None and not rows_standardised(features):
            why = (f"{erased}: what the target depends on (a size, a proportion, a level) is no longer in the inputs, "
                   "so samples with different targets look alike")
            fix = ("Normalise with statistics of the whole training set (one centre and one scale for every sample), "
                   "or keep the per-sample scale and feed it as an extra input (the radius, the extents, the mean and "
                   "std removed).")
        elif rows_standardised(features):
            why = (f"every input row has mean 0 and standard deviation 1 across its own {features.shape[1]} columns: "
                   "each sample was standardised with its own mean and std ((row - row.mean()) / row.std(), axis=1, "
                   "per row instead of per feature), which erases each sample's level and scale, often what the "
                   "target depends on (a building's consumption level, a sensor's amplitude): samples of different "
                   "levels look the same")
            fix = ("Standardise each feature with the training rows' statistics: (x - X_train.mean(0)) / "
                   "X_train.std(0) (StandardScaler), the same for validation; where a per-sample normalisation is "
                   "wanted, also feed the removed mean and std as two extra features.")
        else:
            why = ("usually inputs and targets were misaligned on the way: rows with missing values dropped from the "
                   "features only (X = df[cols].dropna() while y = df[target] keeps every row, then y[:len(X)]), rows "
                   "filtered, shuffled or sorted on one side only; targets precomputed by iterating a shuffled "
                   "DataLoader (a teacher's soft targets, cached embeddings) and stored in dataset order, so each "
                   "input gets another sample's target; or a transform of the target scrambles neighbouring values")
            fix = ("Drop, filter, shuffle and slice inputs and targets together (df = df.dropna(subset=cols) before "
                   "taking X and y from it, or one boolean mask applied to both); precompute per-sample targets with "
                   "shuffle=False (or store them by the sample's index); print a few rows with their targets and "
                   "check them by hand.")
        findings.warning(
            "TARGETS_UNRELATED",
            f"the {'survival' if survival else 'regression'} targets look unrelated to their inputs: over "
            f"{signal.samples} samples read, a 5-nearest-"
            f"neighbour average explains {signal.neighbour_r2:.0%} of their variance and a linear probe "
            f"{signal.linear_r2:.0%}: {why}",
            fix,
            "data.train",
        )

    @staticmethod
    def _multi_label(features: torch.Tensor, targets: torch.Tensor, findings: Findings) -> None:
        labels = multi_label_signal(features, targets)
        if labels is None:
            findings.data["summary"] = "not judged (too few samples, wide inputs or discrete targets)"
            return
        findings.data["summary"] = f"{len(labels)} labels of the multi-hot targets judged against the inputs"
        if not all(label.unrelated for label in labels):
            return
        best = max(labels, key=lambda label: max(label.neighbour_accuracy, label.linear_accuracy) - label.majority)
        findings.warning(
            "TARGETS_UNRELATED",
            f"the multi-label targets look unrelated to their inputs: over {best.samples} samples read, none of the "
            f"{len(labels)} labels judged is predicted from the inputs better than by always answering its commoner "
            f"value (the best: a 5-nearest-neighbour vote {best.neighbour_accuracy:.0%} and a linear probe "
            f"{best.linear_accuracy:.0%} against {best.majority:.0%}). Each row's labels belong to other samples: "
            "a (labels, samples) array stacked label by label reshaped with .view(N, C) / .reshape(N, -1) instead "
            "of transposed (.t()), which fills each row with other samples' labels; or inputs and targets filtered, "
            "shuffled or sorted apart",
            "Transpose a label-major (C, N) array into rows: torch.stack(columns, dim=1) or labels.t().contiguous(), "
            "never .view(N, C); and filter, shuffle and slice inputs and targets together.",
            "data.train",
        )


def first_inputs(ctx: PreflightContext) -> object:
    """The input tensor of the first batch's ``(inputs, targets)``, as the Dataset made it."""
    pair = inputs_beside_labels(ctx.artifacts.first_batch)
    return pair[0] if pair is not None else None
