"""Validation data preprocessed unlike the training data (``data.split_scale``).

(When every off column matches another training column by its quartiles, the validation
table holds the same features in another order: ``VAL_COLUMNS_REORDERED``.)

A scaler fitted and applied to the training split only, a target log-transformed (or
standardised) for training and left raw for validation, images normalised in the training
transform and not in the validation one: every shape and dtype is right, training learns,
and the validation loss is meaningless (a model fed inputs on another scale, scored against
targets in other units). The user sees "validation loss huge, accuracy at chance".

Read from samples of both loaders: per column of the inputs (the batch's floating tensor,
flattened and strided like ``data.split_labels`` reads it) and of float regression targets,
the validation median against the training median and interquartile range. A column is on
another scale when its validation IQR is more than ``SPREAD`` times larger or smaller (a
scaler applied to one split changes each column's spread by its std; a log changes it by
orders of magnitude), or its validation median sits more than ``SHIFT`` training IQRs away.
A random split keeps every column within a fraction of an IQR; a split in time of a
drifting series moves the medians by a few IQRs at the same spread: the finding needs
``MOST`` of the varying columns off.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.column_relations import RelationChange, regression_relation_change
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.feature_leak import LABEL_KEYS
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

TRAIN_SAMPLES, VAL_SAMPLES = 512, 256
MIN_TRAIN, MIN_VAL = 64, 32
SCAN_BUDGET_S = 2.0  # per loader
MAX_COLUMNS = 1024  # values kept per sample (strided): an image's pixels are many columns of one kind
SHIFT = 20.0  # validation median this many training IQRs from the training median
SPREAD = 5.0  # validation IQR this many times larger or smaller
MOST = 0.5  # of the columns that vary in training


def pixel_factor(train_median: float, val_median: float) -> str | None:
    """Which split is 255 times smaller than the other (within 10%), by their medians: 8-bit
    pixels divided by 255 once more in that split."""
    if train_median <= 0 or val_median <= 0:
        return None
    ratio = val_median / train_median
    if abs(ratio / 255 - 1) < 0.1:
        return "training"
    if abs(ratio * 255 - 1) < 0.1:
        return "validation"
    return None


@dataclass
class ScaleMismatch:
    columns: int  # varying columns compared
    off: list[int]  # of them, on another scale
    train: tuple[float, float]  # (median, IQR) of the first off column, training
    val: tuple[float, float]  # ... validation
    reordered: dict[int, int] | None = None  # validation column -> the training column it matches


# A validation column "is" a training column when its median is within this many of that
# column's IQRs and its IQR within this factor.
SAME_MEDIAN, SAME_SPREAD = 0.5, 1.5


def column_order(t: torch.Tensor, v: torch.Tensor, off: list[int]) -> dict[int, int] | None:
    """{validation column: training column} when every off column matches exactly one other
    training column by its quartiles, and the matches permute the off columns: the same
    features in another order."""
    t_iqr, v_iqr = (t[2] - t[0]).clamp_min(1e-30), (v[2] - v[0]).clamp_min(1e-30)
    mapping: dict[int, int] = {}
    for j in off:
        close = [k for k in off if k != j and float((v[1, j] - t[1, k]).abs() / t_iqr[k]) <= SAME_MEDIAN
                 and 1 / SAME_SPREAD <= float(v_iqr[j] / t_iqr[k]) <= SAME_SPREAD]
        if len(close) != 1:
            return None
        mapping[j] = close[0]
    return mapping if sorted(mapping.values()) == sorted(mapping) else None


def _quartiles(values: torch.Tensor) -> torch.Tensor:
    return torch.quantile(values.double(), torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64), dim=0)


def scale_mismatch(train: torch.Tensor, val: torch.Tensor) -> ScaleMismatch | None:
    """Columns of (N, D) validation values on another scale than the (M, D) training ones
    (pure); None when too few columns vary or most columns agree."""
    if train.dim() != 2 or val.dim() != 2 or train.shape[1] != val.shape[1] or len(train) < 8 or len(val) < 8:
        return None
    finite = torch.isfinite(train).all(dim=0) & torch.isfinite(val).all(dim=0)
    t, v = _quartiles(train), _quartiles(val)
    t_iqr, v_iqr = t[2] - t[0], v[2] - v[0]
    # 0/1 columns (a bag of words, one-hot codes) are not on a scale: in a sparse one the quartiles
    # jump between 0 and 1 with the sample.
    binary = ((train == 0) | (train == 1)).all(dim=0)
    varying = finite & (t_iqr > 0) & ~binary
    if int(varying.sum()) == 0:
        return None
    shift = (v[1] - t[1]).abs() / t_iqr.clamp_min(1e-30)
    ratio = v_iqr / t_iqr.clamp_min(1e-30)
    off = varying & ((shift > SHIFT) | (ratio > SPREAD) | (ratio < 1 / SPREAD))
    if int(off.sum()) < MOST * int(varying.sum()):
        return None
    columns = [int(c) for c in torch.nonzero(off).flatten()]
    first = columns[0]
    return ScaleMismatch(int(varying.sum()), columns, (float(t[1, first]), float(t_iqr[first])),
                         (float(v[1, first]), float(v_iqr[first])), column_order(t, v, columns))


COVERAGE_COLUMNS = 3  # inputs of at most this many columns: coordinates, not features of a table
OUTSIDE = 0.3  # of the validation points outside the training range of one column
COVERED_RANGE = 0.6  # the training range at most this share of the validation range


@dataclass
class CoverageGap:
    column: int
    train: tuple[float, float]  # (min, max)
    val: tuple[float, float]
    outside: float  # share of validation points outside the training range


def coverage_gap(train: torch.Tensor, val: torch.Tensor) -> CoverageGap | None:
    """The first column of (M, D <= 3) training inputs whose range covers at most
    COVERED_RANGE of the validation inputs' range, with OUTSIDE of them beyond it (pure)."""
    if train.dim() != 2 or val.dim() != 2 or train.shape[1] != val.shape[1] or not 1 <= train.shape[1] <= \
            COVERAGE_COLUMNS or len(train) < MIN_TRAIN or len(val) < MIN_VAL \
            or not (torch.isfinite(train).all() and torch.isfinite(val).all()):
        return None
    for column in range(train.shape[1]):
        t, v = train[:, column].double(), val[:, column].double()
        t_lo, t_hi, v_lo, v_hi = float(t.min()), float(t.max()), float(v.min()), float(v.max())
        width = v_hi - v_lo
        if width <= 0 or t_hi - t_lo > COVERED_RANGE * width:
            continue
        margin = 0.02 * width
        outside = float(((v < t_lo - margin) | (v > t_hi + margin)).double().mean())
        if outside >= OUTSIDE:
            return CoverageGap(column, (t_lo, t_hi), (v_lo, v_hi), outside)
    return None


EXACT_R2 = 0.9999  # of the training targets a linear fit of the training inputs explains: no noise left
VAL_R2_BELOW = 0.9  # what the same fit explains of the validation targets when only training has the leak
ROWS_PER_COLUMN = 3


def _r2(x: torch.Tensor, y: torch.Tensor, coefficients: torch.Tensor) -> float:
    residual = y - x @ coefficients
    spread = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float((residual ** 2).sum()) / spread if spread > 0 else 0.0


def linear_leak(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor,
                val_y: torch.Tensor) -> tuple[float, float, int] | None:
    """(training R², validation R², training rows) when a least-squares fit of the training
    targets on the training inputs is exact and does not hold on validation (pure). Real
    targets carry noise, so an exact linear relation is one the pipeline built."""
    if train_y.dim() == 2 and train_y.shape[1] == 1:
        train_y, val_y = train_y[:, 0], val_y[:, 0]
    if train_x.dim() != 2 or val_x.dim() != 2 or train_y.dim() != 1 or val_y.dim() != 1 \
            or train_x.shape[1] != val_x.shape[1] or len(train_x) != len(train_y) or len(val_x) != len(val_y) \
            or len(train_x) < ROWS_PER_COLUMN * (train_x.shape[1] + 1) or train_x.shape[1] > MAX_COLUMNS:
        return None
    design = torch.cat([train_x.double(), torch.ones(len(train_x), 1, dtype=torch.float64)], 1)
    held = torch.cat([val_x.double(), torch.ones(len(val_x), 1, dtype=torch.float64)], 1)
    if not (bool(torch.isfinite(design).all()) and bool(torch.isfinite(held).all())):
        return None
    coefficients = torch.linalg.lstsq(design, train_y.double()[:, None]).solution[:, 0]
    train_r2 = _r2(design, train_y.double(), coefficients)
    if train_r2 < EXACT_R2:
        return None
    val_r2 = _r2(held, val_y.double(), coefficients)
    return (train_r2, val_r2, len(train_x)) if val_r2 < VAL_R2_BELOW else None


UNIT_RATIO = 3.0  # a rescaling moves the median and the spread by the same factor, within this
STANDARD_MEDIAN, STANDARD_SPREAD = 0.5, (0.5, 3.0)  # a standardised column: median within half an IQR of 0


def unit_change(t_median: float, t_iqr: float, v_median: float, v_iqr: float) -> bool:
    """Whether one split's targets are the other's in other units (pure): rescaled (the median
    and the spread moved by one factor, or by 255), logged (one median the log of the other's),
    or standardised (one side centred on 0 with a spread near 1)."""
    if pixel_factor(t_median, v_median) is not None:
        return True
    if t_median * v_median > 0 and t_iqr > 0 and v_iqr > 0:
        by_median, by_spread = v_median / t_median, v_iqr / t_iqr
        if 1 / UNIT_RATIO <= by_median / by_spread <= UNIT_RATIO:
            return True
    for logged, raw, spread in ((t_median, v_median, t_iqr), (v_median, t_median, v_iqr)):
        if raw > 0 and abs(logged - math.log1p(raw)) <= max(spread, 0.1 * abs(logged)) + 0.1:
            return True
    return any(abs(median) <= STANDARD_MEDIAN * iqr and STANDARD_SPREAD[0] <= iqr <= STANDARD_SPREAD[1]
               for median, iqr in ((t_median, t_iqr), (v_median, v_iqr)))


def inputs_beside_labels(batch: Any) -> tuple[Any, Any] | None:
    """(inputs, labels) of an ``(x, y)`` batch, or of a mapping with one label key and one
    floating tensor beside it; None for other batches (nothing checked about the two)."""
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, Mapping):
        keys = [key for key in LABEL_KEYS if key in batch]
        floats = [value for key, value in batch.items() if key not in keys and isinstance(value, torch.Tensor)
                  and value.is_floating_point()]
        if len(keys) == 1 and len(floats) == 1:
            return floats[0], batch[keys[0]]
    return None


def inputs_and_targets(batch: Any) -> tuple[torch.Tensor | None, torch.Tensor | None] | None:
    """(inputs (B, D) float, regression targets (B, K) float or None) of an ``(x, y)`` batch or a
    mapping with one label key and one floating tensor beside it; None for other batches."""
    if isinstance(batch, (list, tuple)) and len(batch) == 1 and isinstance(batch[0], torch.Tensor) \
            and batch[0].layout == torch.strided and batch[0].is_floating_point() and batch[0].dim() >= 2:
        # (x,) alone: an autoencoder's or a PINN's collocation points, inputs without targets
        return _columns(batch[0]), None
    pair = inputs_beside_labels(batch)
    if pair is None:
        # (features, targets, input lengths, target lengths) and other longer tuples: the
        # features lead, and which of the rest is a regression target is not known
        if not isinstance(batch, (list, tuple)) or len(batch) < 3 or not isinstance(batch[0], torch.Tensor) \
                or batch[0].layout != torch.strided or not batch[0].is_floating_point():
            return None
        pair = batch[0], torch.zeros(len(batch[0]), dtype=torch.long)
    inputs, targets = pair
    if not isinstance(inputs, torch.Tensor) or not isinstance(targets, torch.Tensor) or inputs.dim() < 2 \
            or targets.dim() == 0 or targets.shape[0] != inputs.shape[0]:
        return None
    flat = _columns(inputs) if inputs.is_floating_point() else None
    regression = targets.detach().reshape(targets.shape[0], -1) if targets.is_floating_point() \
        and targets.dim() <= 2 else None
    if regression is not None and bool(((regression == 0) | (regression == 1)).all()):
        regression = None  # binary labels as floats: classes, not a scale
    return flat, regression.float().cpu() if regression is not None else None


def _columns(inputs: torch.Tensor) -> torch.Tensor:
    """(B, D) float32 CPU columns of a float input, strided down to MAX_COLUMNS."""
    flat = inputs.detach().reshape(inputs.shape[0], -1)
    if flat.shape[1] > MAX_COLUMNS:
        flat = flat[:, ::-(-flat.shape[1] // MAX_COLUMNS)]
    return flat.float().cpu()


WHOLE_VAL = 4096  # validation sets up to this size are read whole for their exact statistics
EXACT = 1e-4  # a column's mean within this of 0 (and std of 1) over the whole set: fitted on it

FRACTIONAL = 0.5  # of the validation targets with a fractional part: continuous values, not class ids


def truncated_targets(train_batch: Any, val_batch: Any) -> tuple[str, float, float] | None:
    """(training dtype, share of fractional validation targets, an example) when the training
    targets are integers while the validation targets of the same range carry fractions: a
    ``dtype=torch.long`` cast in the training Dataset that truncates continuous targets."""
    train, val = inputs_beside_labels(train_batch), inputs_beside_labels(val_batch)
    if train is None or val is None:
        return None
    t, v = train[1], val[1]
    if not (isinstance(t, torch.Tensor) and isinstance(v, torch.Tensor)) or t.is_floating_point() \
            or t.dtype == torch.bool or not v.is_floating_point() or t.numel() == 0 or v.numel() < 8:
        return None
    values = v.detach().float().reshape(-1).cpu()
    values = values[torch.isfinite(values)]
    fractional = (values != values.round())
    if values.numel() < 8 or float(fractional.float().mean()) < FRACTIONAL:
        return None
    low, high = float(t.min()), float(t.max())
    if not low - 1 <= float(values.median()) <= high + 1:
        return None  # another quantity altogether
    return str(t.dtype).replace("torch.", ""), float(fractional.float().mean()), float(values[fractional][0])


class SplitScaleCheck(Check):
    """VAL_INPUTS_OTHER_SCALE / VAL_TARGETS_OTHER_SCALE: the validation split preprocessed unlike
    the training split."""

    name = "data.split_scale"
    stage = Stage.DATA
    codes = ("VAL_INPUTS_OTHER_SCALE", "VAL_TARGETS_OTHER_SCALE", "VAL_COLUMNS_REORDERED", "VAL_COLUMNS_RECODED", "TARGETS_CAST_TO_INT",
             "VAL_SCALER_REFIT", "TRAIN_TARGET_IN_INPUTS", "VAL_OUTSIDE_TRAIN_RANGE")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if ctx.val_loader is None:
            findings.data["summary"] = "no validation loader"
            return
        self._cast_targets(ctx, findings)
        first = inputs_and_targets(ctx.artifacts.first_batch)
        if first is None or (first[0] is None and first[1] is None):
            # Token ids and class labels: nothing here has a scale to compare.
            findings.data["summary"] = "no float inputs or regression targets"
            return
        if first[0] is not None and self._refit_on_validation(ctx, findings):
            findings.data["summary"] = "validation inputs standardised on themselves"
            return
        train = self._read(ctx, findings, ctx.train_loader, TRAIN_SAMPLES, "training")
        val = self._read(ctx, findings, ctx.val_loader, VAL_SAMPLES, "validation")
        read = [len(part) for part in (train or ()) if part is not None]
        if train is None or val is None or not read or max(read) < MIN_TRAIN:
            findings.data["summary"] = "too few samples read"
            return
        summary = []
        rescaled = False
        for index, (what, code) in enumerate((("inputs", "VAL_INPUTS_OTHER_SCALE"),
                                              ("regression targets", "VAL_TARGETS_OTHER_SCALE"))):
            if train[index] is None or val[index] is None or len(val[index]) < MIN_VAL:
                continue
            found = scale_mismatch(train[index], val[index])
            summary.append(f"{what}: {len(found.off) if found else 0} column(s) on another scale")
            if found is not None and code == "VAL_TARGETS_OTHER_SCALE" and not unit_change(*found.train, *found.val):
                rescaled = True
                self._other_quantity(found, findings)
            elif found is not None:
                rescaled = True
                self._report(code, what, found, findings)
        if not rescaled and train[0] is not None and val[0] is not None and len(val[0]) >= MIN_VAL:
            self._uncovered(coverage_gap(train[0], val[0]), findings)
        if not rescaled and all(part is not None and len(part) >= MIN_VAL for part in (*train, *val)):
            self._recoded(regression_relation_change(train[0], train[1], val[0], val[1]), findings)
            self._target_in_training_inputs(linear_leak(train[0], train[1], val[0], val[1]), findings)
        findings.data["summary"] = "; ".join(summary) or "nothing comparable"

    @staticmethod
    def _uncovered(found: CoverageGap | None, findings: Findings) -> None:
        """VAL_OUTSIDE_TRAIN_RANGE: low-dimensional inputs (coordinates) whose training values
        cover only part of the range validation spans."""
        if found is None:
            return
        findings.warning(
            "VAL_OUTSIDE_TRAIN_RANGE",
            f"the training inputs cover only [{found.train[0]:.3g}, {found.train[1]:.3g}] of input column "
            f"{found.column}, while the validation inputs span [{found.val[0]:.3g}, {found.val[1]:.3g}]: "
            f"{found.outside:.0%} of the validation points lie outside anything trained on. Points sampled over "
            "the wrong interval do this: collocation points (or training coordinates) drawn with torch.rand, in "
            "[0, 1), for a domain [-1, 1], a grid built over half the domain, a split by coordinate; the model is "
            "then scored where it can only extrapolate",
            "Sample the training inputs over the whole domain: x = lo + (hi - lo) * torch.rand(n, 1) (for [-1, 1]: "
            "torch.rand(n, 1) * 2 - 1), or split the points at random rather than by coordinate.",
            "data.train",
        )

    @staticmethod
    def _target_in_training_inputs(found: tuple[float, float, int] | None, findings: Findings) -> None:
        """TRAIN_TARGET_IN_INPUTS: training targets that are exactly a linear function of the
        training inputs, a relation validation does not share."""
        if found is None:
            return
        train_r2, val_r2, rows = found
        findings.warning(
            "TRAIN_TARGET_IN_INPUTS",
            f"a linear function of the training inputs reproduces their regression targets exactly (R² {train_r2:.5f} "
            f"over {rows} training rows), while the same function explains R² {val_r2:.2f} of the validation targets: "
            "the training inputs carry the target itself. Windows normalised with statistics that include the target "
            "(a window and its target z-scored together sum to zero, so the target is minus the sum of the inputs), "
            "a feature computed from the label, or the target left among the feature columns do this; the model "
            "learns that leak, and validation, built without it, shows what it learned of the signal",
            "Build every training input from what the model will have at prediction time: normalise a window with "
            "the statistics of its inputs only (mean and std of x, not of x and y), and drop columns derived from "
            "the target.",
            "data.train",
        )

    @staticmethod
    def _recoded(found: RelationChange | None, findings: Findings) -> None:
        """VAL_COLUMNS_RECODED for a regression target: columns whose correlation with it differs
        between the splits beyond sampling noise, at unchanged scale."""
        if found is None:
            return
        shown = "; ".join(f"column {c.column}: {c.train_d:+.2f} in training, {c.val_d:+.2f} in validation"
                          for c in found.changed[:3])
        findings.data["recoded_columns"] = [c.column for c in found.changed]
        findings.warning(
            "VAL_COLUMNS_RECODED",
            f"{len(found.changed)} input column(s) relate to the regression target one way in training and another "
            f"in validation, far beyond sampling noise, though their scale is unchanged (correlation with the target: "
            f"{shown}; {found.carrying} column(s) carry the target in training). The columns mean other things in "
            "the two splits: one-hot (dummy) columns built separately per split (pd.get_dummies of each split: a "
            "category missing from one split shifts every column after it, and padding the shorter table misaligns "
            "the rest), a category -> code table fitted per split, or columns selected or ordered per split. The "
            "validation score measures the model on features it never saw",
            "Fit every encoding on the training split and apply that same one to validation (and test): "
            "pd.get_dummies(df_val).reindex(columns=train_columns, fill_value=0), or OneHotEncoder(handle_unknown="
            "'ignore').fit(X_train_categories) then .transform on each split; one fixed column list for all splits.",
            "data.val",
        )

    def _refit_on_validation(self, ctx: PreflightContext, findings: Findings) -> bool:
        """VAL_SCALER_REFIT: the whole validation set standardised to mean 0 and std 1 exactly, column
        by column: statistics fitted on the validation set itself (the training split's scaler
        leaves its means off 0 by sampling noise at least)."""
        dataset = getattr(ctx.val_loader, "dataset", None)
        try:
            size = len(dataset)  # type: ignore[arg-type]
        except TypeError:
            return False
        if not MIN_VAL <= size <= WHOLE_VAL:
            return False
        def float_inputs(batch: Any) -> torch.Tensor | None:
            pair = inputs_and_targets(batch)
            return pair[0] if pair is not None else None

        parts = read_samples(ctx, self.name, findings, ctx.val_loader, f"the validation set for {self.name}",
                             float_inputs, size, SCAN_BUDGET_S)
        if not parts or len({p.shape[1] for p in parts}) != 1:
            return False
        values = torch.cat(parts).double()
        if len(values) != size:
            return False  # not the whole set: its mean says nothing exact
        spread = values.std(0)
        varying = spread > 0
        if int(varying.sum()) < 2:
            return False
        means, biased = values.mean(0)[varying], values.std(0, unbiased=False)[varying]
        unit = ((spread[varying] - 1).abs() < EXACT) | ((biased - 1).abs() < EXACT)
        if not bool((means.abs() < EXACT).all()) or not bool(unit.all()):
            return False
        findings.warning(
            "VAL_SCALER_REFIT",
            f"all {size} validation samples have every one of their {int(varying.sum())} varying input columns at mean "
            "0 and standard deviation 1 exactly: the validation inputs were standardised with statistics fitted on "
            "the validation set itself (scaler.fit_transform(X_val), or a StandardScaler fitted per split), not with "
            "the training split's. A validation set that differs from training (newer, larger, another site) is then "
            "moved onto the training distribution, its differences erased, and what the model is scored on is not "
            "what it will see",
            "Fit the scaler once, on the training inputs, and only transform the others: scaler.fit(X_train); X_val = "
            "scaler.transform(X_val) (never fit_transform on validation or test data).",
            "data.val",
        )
        return True

    def _cast_targets(self, ctx: PreflightContext, findings: Findings) -> None:
        """TARGETS_CAST_TO_INT: integer training targets beside fractional validation ones."""
        if inputs_beside_labels(ctx.artifacts.first_batch) is None:
            return
        parts = read_samples(ctx, self.name, findings, ctx.val_loader, f"a validation batch for {self.name}",
                             lambda batch: [batch], 1, SCAN_BUDGET_S)
        found = truncated_targets(ctx.artifacts.first_batch, parts[0][0]) if parts else None
        if found is None:
            return
        dtype, share, example = found
        findings.warning(
            "TARGETS_CAST_TO_INT",
            f"the training targets are {dtype} while {share:.0%} of the validation targets, in the same range, have "
            f"a fractional part (e.g. {example:.4g}): the training Dataset casts continuous targets to an integer "
            "type (torch.tensor(y, dtype=torch.long), .long(), astype(int)), which truncates them (3.7 -> 3), so the "
            "model learns floor(y), biased low by half a unit on average, and is scored against the real values",
            "Keep regression targets floating: torch.tensor(y, dtype=torch.float32) (or torch.from_numpy(y).float()) "
            "in the training Dataset, as in the validation one.",
            "data.train",
        )

    @staticmethod
    def _other_quantity(found: ScaleMismatch, findings: Findings) -> None:
        (t_median, t_iqr), (v_median, v_iqr) = found.train, found.val
        findings.info(
            "VAL_TARGETS_OTHER_SCALE",
            f"the validation regression targets (median {v_median:.4g}, interquartile range {v_iqr:.4g}) are not the "
            f"training ones (median {t_median:.4g}, {t_iqr:.4g}) in other units: no rescaling, log or standardisation "
            "turns one into the other, so the two splits hold different quantities, which is by design where the "
            "loss reads the training targets otherwise (a physics-informed loss trained on a PDE's forcing and "
            "validated on its solution)",
            "If both splits should hold the same quantity, build their targets from the same column and transform.",
            "data.val",
        )

    @staticmethod
    def _report(code: str, what: str, found: ScaleMismatch, findings: Findings) -> None:
        (t_median, t_iqr), (v_median, v_iqr) = found.train, found.val
        shown = ", ".join(str(c) for c in found.off[:6]) + (" ..." if len(found.off) > 6 else "")
        if code == "VAL_INPUTS_OTHER_SCALE" and found.reordered:
            pairs = ", ".join(f"{j} <- {k}" for j, k in list(found.reordered.items())[:6])
            findings.warning(
                "VAL_COLUMNS_REORDERED",
                f"the validation inputs hold the training features in another order: {len(found.reordered)} of the "
                f"{found.columns} columns are off, and each matches another training column by its median and spread "
                f"(validation column <- training column: {pairs}). The feature table was built with its columns in "
                "another order for validation (a dict or set of column names, df[cols] with cols listed differently, "
                "a pivot sorted otherwise), so the model reads each feature in another one's place",
                "Select the columns by one fixed list for every split (feature_cols = [...]; X_val = df_val["
                "feature_cols]) and build the arrays from it, or save the training column order and reindex the "
                "validation frame with it (df_val[df_train.columns]).",
                "data.val",
            )
            return
        if code == "VAL_INPUTS_OTHER_SCALE":
            cause = ("a scaler or normalisation fitted and applied to the training split only (StandardScaler."
                     "fit_transform on X_train and nothing on X_val), or a Normalize in the training transform that "
                     "the validation transform lacks")
            fix = ("Preprocess every split the same way with the training split's statistics: fit the scaler on "
                   "the training inputs once and call scaler.transform on the validation (and test) inputs; give the "
                   "validation transform the same ToTensor / Normalize as the training one (without the random "
                   "augmentation).")
        else:
            cause = ("a target transform applied to the training targets only (np.log1p(y_train), a standardisation "
                     "of y_train) while the validation targets stay in raw units, so the validation loss compares "
                     "predictions in one unit with targets in another")
            fix = ("Transform the targets of every split the same way (log1p, or (y - y_mean) / y_std with the "
                   "training statistics), and invert the transform on the predictions when reporting in raw units.")
        factor = pixel_factor(t_median, v_median)
        if factor is not None:
            smaller = "training" if factor == "training" else "validation"
            cause = (f"the {smaller} values are 255 times smaller than the other split's: pixels divided by 255 twice in "
                     f"the {smaller} pipeline (x / 255 in the Dataset and again in a normalisation step, or ToTensor() "
                     "followed by / 255), or once in one split only")
            fix = "Divide 8-bit pixels by 255 exactly once, in one transform every split shares. " + fix
        findings.warning(
            code,
            f"the validation {what} are on another scale than the training {what}: {len(found.off)} of the "
            f"{found.columns} columns that vary in training are off (column(s) {shown}); the first has median "
            f"{t_median:.4g} and interquartile range {t_iqr:.4g} in training, {v_median:.4g} and {v_iqr:.4g} in "
            f"validation. The splits were preprocessed differently: {cause}. Training can look healthy while the "
            "validation scores are meaningless",
            fix,
            "data.val",
        )

    def _read(self, ctx: PreflightContext, findings: Findings, loader: Any, limit: int,
              which: str) -> tuple[torch.Tensor | None, torch.Tensor | None] | None:
        def convert(batch: Any) -> tuple[torch.Tensor, torch.Tensor | None] | None:
            pair = inputs_and_targets(batch)
            if pair is None:
                return None
            inputs, targets = pair
            rows = len(inputs) if inputs is not None else len(targets) if targets is not None else 0
            # (B, 0) stands for inputs that are not floats, so every part counts its rows.
            return (inputs if inputs is not None else torch.empty(rows, 0)), targets

        parts = read_samples(ctx, self.name, findings, loader, f"{which} samples for {self.name}", convert, limit,
                             SCAN_BUDGET_S)
        if not parts:
            return None

        def joined(pieces: list[torch.Tensor | None]) -> torch.Tensor | None:
            if any(p is None or p.shape[1] == 0 for p in pieces) or len({p.shape[1] for p in pieces}) != 1:  # type: ignore[union-attr]
                return None
            return torch.cat(pieces)[:limit]  # type: ignore[arg-type]

        return joined([part[0] for part in parts]), joined([part[1] for part in parts])
