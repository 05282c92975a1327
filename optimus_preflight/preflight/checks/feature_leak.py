"""Label leakage through the features (``data.label_in_features``): a feature column of a
tabular batch that equals the label or a relabelling of it (an encoding, an affine
rescaling, a one-hot group), so the model reads the answer from its input: warning.

A window of a sequence, (B, T, F) features, is read as T * F columns: a forecasting window
cut one step too long (``series[i : i + W + 1]`` for the target ``series[i + W]``) holds its
own target at its last step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.series import lag_one
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


@dataclass
class FeatureMatch:
    columns: list[int]
    kind: str  # equal | relabelling | affine | one_hot


SERIES_COLUMNS, SERIES_SMOOTH = 8, 0.5  # (B, T) float rows this smooth along T are windows of a series
MAX_WINDOW_COLUMNS = 4096  # columns of a (B, T, F) window compared one by one
LABEL_KEYS = ("label", "labels", "target", "targets", "y")  # where a mapping batch keeps its labels


def _labels_of(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(features (B, F), labels (B,)) of a tabular batch: ``(x, y)`` or a mapping with a
    label key and one 2-D feature tensor."""
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        features, labels = batch
    elif isinstance(batch, Mapping):
        keys = [key for key in LABEL_KEYS if key in batch]
        others = [value for key, value in batch.items() if key not in keys and isinstance(value, torch.Tensor)
                  and value.dim() == 2]
        if len(keys) != 1 or len(others) != 1:
            return None
        features, labels = others[0], batch[keys[0]]
    else:
        return None
    if not (isinstance(features, torch.Tensor) and isinstance(labels, torch.Tensor)):
        return None
    # One column is the input itself (a toy y = a * x + b), not a column beside the label.
    if features.dim() not in (2, 3) or features[0].numel() < 2 or not features.is_floating_point() or \
            labels.shape[0] != features.shape[0]:
        return None
    if features.dim() == 3 and features[0].numel() > MAX_WINDOW_COLUMNS:  # a spectrogram or an image, not a window
        return None
    if labels.dim() == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.dim() != 1:
        return None
    return features, labels.long() if labels.dtype == torch.bool else labels


MIN_ROWS = 8


def horizon_overlap(batch: Any) -> tuple[int, int] | None:
    """(window length, horizon) of an ``(x, y)`` batch of (B, W) float windows and (B, H >= 2)
    float horizons whose first step equals the window's last value in every row (and the
    second does not): horizons cut one step early."""
    if not isinstance(batch, (list, tuple)) or len(batch) != 2:
        return None
    x, y = batch
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or not x.is_floating_point() \
            or not y.is_floating_point():
        return None
    if x.dim() == 3 and x.shape[2] == 1:
        x = x[..., 0]
    if y.dim() == 3 and y.shape[2] == 1:
        y = y[..., 0]
    if x.dim() != 2 or y.dim() != 2 or len(x) < MIN_ROWS or len(y) != len(x) or x.shape[1] < 2 or y.shape[1] < 2:
        return None
    last, first, second = x[:, -1], y[:, 0], y[:, 1]
    if not torch.equal(last, first) or torch.equal(last, second) or bool((last == last[0]).all()):
        return None
    return x.shape[1], y.shape[1]
CHANCE = 1e-3  # a coincidental match over the batch must be this unlikely
# |correlation| of a column with a continuous label: a label stored at float16 precision
# still reaches 1 - 1e-7; no two measured quantities do by chance over 8+ rows.
AFFINE_TOLERANCE = 1e-6


def _log_arrangements(counts: list[int]) -> float:
    """log of the number of ways to place these class counts on the rows: a random
    column with matching value counts lines up with the labels once in this many."""
    return math.lgamma(sum(counts) + 1) - sum(math.lgamma(c + 1) for c in counts)


def feature_label_matches(features: torch.Tensor, labels: torch.Tensor) -> list[FeatureMatch]:
    """Columns of ``features`` that determine ``labels`` on these rows (pure):
    - class labels: a column whose values map one-to-one onto the labels (the label,
      an encoding or rescaling of it), or a group of 0/1 columns that one-hot encodes it;
    - continuous labels: a column equal to a * label + b.
    A class match counts only where chance could not produce it: every class present at
    least twice, and few enough candidate columns for the batch size (``CHANCE``)."""
    rows = features.shape[0]
    if rows < MIN_ROWS:
        return []
    x = features.detach().to(torch.float64).cpu()
    y = labels.detach().to(torch.float64).cpu()
    values, counts = torch.unique(y, return_counts=True)
    classes = len(values)
    if classes < 2:
        return []
    integral = bool((y == y.round()).all())
    if not integral or classes > rows // 2:
        return _affine_matches(x, y)
    if int(counts.min()) < 2:
        return []
    log_chance = -_log_arrangements(counts.tolist()) + math.lgamma(classes + 1)
    found: list[FeatureMatch] = []
    candidates = [j for j in range(x.shape[1]) if len(torch.unique(x[:, j])) == classes]
    if candidates and math.log(len(candidates)) + log_chance < math.log(CHANCE):
        for j in candidates:
            pairs = torch.unique(torch.stack([x[:, j], y], dim=1), dim=0)
            if len(pairs) == classes:  # each column value goes with one label and back
                kind = "equal" if torch.equal(x[:, j], y) else "relabelling"
                found.append(FeatureMatch([j], kind))
    if found or classes < 3:
        return found
    binary = [j for j in range(x.shape[1]) if bool(((x[:, j] == 0) | (x[:, j] == 1)).all())]
    group: list[int] = []
    log_total = 0.0
    for value, count in zip(values, counts, strict=True):
        indicator = (y == value).to(torch.float64)
        column = next((j for j in binary if torch.equal(x[:, j], indicator)), None)
        if column is None:
            return []
        group.append(column)
        log_total += math.log(len(binary)) - _log_arrangements([int(count), rows - int(count)])
    return [FeatureMatch(group, "one_hot")] if log_total < math.log(CHANCE) else []


def _affine_matches(x: torch.Tensor, y: torch.Tensor) -> list[FeatureMatch]:
    centred = y - y.mean()
    if float(centred.norm()) == 0:
        return []
    found = []
    for j in range(x.shape[1]):
        column = x[:, j] - x[:, j].mean()
        scale = float(column.norm())
        if scale == 0:
            continue
        correlation = float(column @ centred) / (scale * float(centred.norm()))
        if abs(correlation) > 1 - AFFINE_TOLERANCE:
            found.append(FeatureMatch([j], "equal" if torch.allclose(x[:, j], y) else "affine"))
    return found


# Target encoding that includes the row's own label: the group mean equals the label exactly
# wherever the group is one row (continuous labels), and is 0 or 1 only where it agrees
# with the row's own binary label. Out-of-fold or leave-one-out encodings disagree there often.
OWN_LABEL_SHARE = 0.05  # of the rows, a continuous label equal to the column (no chance equality)
MIN_EQUAL_ROWS = 3
PURE_SHARE = 0.25  # of the rows, a binary label's column at exactly 0 or 1 ...
PURE_AGREEMENT = 0.99  # ... and equal to the row's label there
MIN_PURE_ROWS = 12


def own_label_encoded(features: torch.Tensor, labels: torch.Tensor) -> tuple[int, int, int] | None:
    """(column, rows where the column gives the label away, rows) of a column that is a mean of
    the label over a group including the row itself (pure); None when no column is."""
    x = features.detach().double().cpu()
    y = labels.detach().double().cpu()
    rows = len(y)
    if rows < MIN_ROWS:
        return None
    binary = bool(((y == 0) | (y == 1)).all())
    continuous = not bool((y == y.round()).all())
    for j in range(x.shape[1]):
        column = x[:, j]
        if continuous:
            # A one-row group's encoding is that row's own label, a value no other row shares; a
            # constant both columns hold (a gap filled with 0 in inputs and target alike) is not.
            values, counts = torch.unique(column, return_counts=True)
            repeated = values[counts > 1]
            equal = int(((column == y) & ~torch.isin(column, repeated)).sum())
            if equal >= max(MIN_EQUAL_ROWS, OWN_LABEL_SHARE * rows) and equal < rows:
                return j, equal, rows
        elif binary:
            ends = (column == 0) | (column == 1)
            if bool(ends.all()) or int(ends.sum()) < max(MIN_PURE_ROWS, PURE_SHARE * rows):
                continue  # a binary feature, or too few rows at the ends to tell
            if float((column[ends] == y[ends]).double().mean()) >= PURE_AGREEMENT:
                return j, int(ends.sum()), rows
    return None


class FeatureLabelCheck(Check):
    """A tabular feature column that is the label, or a trivial function of it."""

    name = "data.label_in_features"
    stage = Stage.DATA
    codes = ("LEAK_FEATURE",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        pair = _labels_of(ctx.artifacts.first_batch)
        if pair is None:
            findings.data["summary"] = "not a (features, labels) batch"
            overlap = horizon_overlap(ctx.artifacts.first_batch)
            if overlap is not None:
                self._horizon_overlap(*overlap, findings)
            return
        features, labels = pair
        window = tuple(features.shape[1:]) if features.dim() == 3 else None
        matches = feature_label_matches(features.reshape(features.shape[0], -1), labels)
        findings.data["summary"] = f"{features[0].numel()} feature columns, {len(matches)} determine the label"
        if not matches:
            encoded = own_label_encoded(features.reshape(features.shape[0], -1), labels) if window is None else None
            if encoded is not None:
                self._own_label(encoded, findings)
            return
        findings.data["columns"] = [match.columns for match in matches]

        # (B, T) rows smooth from one column to the next are windows of a series, not a table.
        series = (window is None and features.dim() == 2 and features.shape[1] >= SERIES_COLUMNS
                  and features.is_floating_point() and lag_one(features, 1) >= SERIES_SMOOTH)

        def where(column: int) -> str:
            if series and column == features.shape[1] - 1:
                return (f"column {column}, the last value of each {features.shape[1]}-step window (the target was taken "
                        f"as series[i + {features.shape[1]} - 1], inside the window, not the next step series[i + "
                        f"{features.shape[1]}]: the model learns to echo its last input, a persistence forecast),")
            if window is None:
                return f"column {column}"
            step, feature = divmod(column, window[1])
            why = (" (the window's last step: it was cut one step too long and holds its target)"
                   if step == window[0] - 1 else
                   " (a past step the window already holds: the target was built from the past, e.g. "
                   "df[col].shift(1), the previous step, where shift(-1), the next one, was meant)")
            return f"step {step} of feature {feature} in the {window} windows{why}"

        described = "; ".join(
            f"{where(match.columns[0])} " + {"equal": "equals the label", "relabelling": "is a relabelling of the label",
                                              "affine": "is a linear function of the label"}[match.kind]
            if match.kind != "one_hot" else f"columns {match.columns} one-hot encode the label"
            for match in matches[:4])
        how = ("drop the label and anything computed from it from the features (e.g. X = df.drop(columns=[target]); "
               "fit encoders and scalers on the features only); for a window over a series, forecast a step the "
               "window does not hold: y = series[i + W] for x = series[i : i + W] (df[col].shift(-1) for the next "
               "step).")
        if window is not None:
            how = ("make the target a step the window does not hold: y = series[i + W] for x = series[i : i + W] "
                   "(not a window series[i : i + W + 1], and df[col].shift(-1) for the next step, not shift(1)); "
                   "drop the target's own column from the window's features.")
        findings.warning(
            "LEAK_FEATURE",
            f"in the first batch ({features.shape[0]} samples) {described}: the label is already in the inputs (a "
            "leak), so the model reads the answer instead of learning it, training and validation look perfect and "
            "the model is useless on data without the label. A label column left among the features does this, and so "
            "does, for a sliding window over a series, a target built from a step the window holds (shifted into the "
            "past with df[col].shift(1) where shift(-1) was meant, or a window cut one step too long)"
            + (": the label equals the last input column, the window's last value, so the forecast target was not "
               "shifted past the window (off by one: y = series[i + W - 1] where series[i + W] was meant)"
               if any(match.kind == "equal" and match.columns[0] == features.shape[1] - 1 for match in matches)
               else ""),
            "Where the dataset builds its features, " + how,
            "data.train",
            code_fix="In the dataset of the DataLoader your build_dataloaders() returns, " + how,
        )

    @staticmethod
    def _horizon_overlap(window: int, horizon: int, findings: Findings) -> None:
        findings.warning(
            "LEAK_FEATURE",
            f"the first of each sample's {horizon} target steps equals the last value of its {window}-step input "
            "window, in every row of the first batch, while the later targets do not repeat it: the horizon was cut "
            f"from series[i + {window} - 1 : ...], inside the window, instead of series[i + {window} : i + {window} + "
            f"{horizon}] (off by one). Every target is one step too early: the first is the model's own input echoed, "
            "and the rest are labelled with the wrong lead time",
            f"Start the horizon right after the window: x = series[i : i + W], y = series[i + W : i + W + H] "
            f"(here W = {window}, H = {horizon}).",
            "data.train",
        )

    @staticmethod
    def _own_label(encoded: tuple[int, int, int], findings: Findings) -> None:
        column, giving, rows = encoded
        findings.data["columns"] = [[column]]
        how = ("compute the encoding out of fold: for training rows from the other folds (or leave-one-out: "
               "(group_sum - y) / (group_count - 1)), for validation and test rows from the training split only, "
               "with smoothing towards the global mean for small groups.")
        findings.warning(
            "LEAK_FEATURE",
            f"column {column} is a mean of the label over a group that includes the row itself (a target encoding "
            f"computed on the whole table): in {giving} of the {rows} rows of the first batch it gives the row's own "
            "label away (equal to it, or 0 / 1 exactly where the row's label is that), because small groups "
            "average little more than the row's own label. Training and validation look excellent through this "
            "leak, while new rows, encoded from other rows only, are predicted far worse",
            "Where the dataset builds its features, " + how,
            "data.train",
            code_fix="In the dataset of the DataLoader your build_dataloaders() returns, " + how,
        )
