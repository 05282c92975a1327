"""Inputs standardised per sample beside targets whose scale varies (``data.sample_standardised``).

``(a - a.mean()) / a.std()`` inside ``__getitem__`` standardises every sample with its own
statistics: each input (or each of its channels) comes out at mean 0 and std 1. That erases
the sample's offset and amplitude. Where the target does not depend on them (a shape
classifier over z-normalised series, a convention) nothing is lost; where a regression target
scales with them (a PDE solution with its coefficient field, a forecast with its level), the
model is shown inputs that all look alike in size and asked for outputs that differ by a
factor of ten.

Read from the first training batch of ``(inputs, targets)``: a channel whose every sample sits
at mean 0 and std 1 exactly (constant channels, such as a coordinate grid, are left aside), and
float regression targets whose per-sample RMS varies by ``SPREAD`` or more between the 10th and
the 90th percentile of the samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.split_scale import inputs_beside_labels
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_SAMPLES, MIN_VALUES = 8, 8
EXACT = 1e-3  # of mean 0 and std 1, per sample: fitted on the sample itself
SPREAD = 3.0  # the targets' per-sample RMS, 90th over 10th percentile


def standardised_channels(inputs: torch.Tensor) -> list[int]:
    """The channels (dim 1 of a (B, C, ...) input, or the whole sample of a (B, D) one, as
    channel 0) at mean 0 and std 1 in every sample, and not the same in every sample (pure)."""
    if inputs.dim() == 2:
        inputs = inputs[:, None]
    if inputs.dim() < 3 or len(inputs) < MIN_SAMPLES:
        return []
    values = inputs.detach().float().reshape(inputs.shape[0], inputs.shape[1], -1)
    if values.shape[-1] < MIN_VALUES:
        return []
    found = []
    for channel in range(values.shape[1]):
        rows = values[:, channel]
        if bool((rows == rows[:1]).all()):
            continue  # a grid or a constant: the same for every sample
        means, unbiased, biased = rows.mean(1), rows.std(1), rows.std(1, unbiased=False)
        unit = ((unbiased - 1).abs() < EXACT).all() or ((biased - 1).abs() < EXACT).all()
        if bool((means.abs() < EXACT).all()) and bool(unit):
            found.append(channel)
    return found


def target_scale_spread(targets: torch.Tensor) -> tuple[float, float] | None:
    """(10th, 90th percentile) of the float targets' per-sample RMS, when they differ by
    ``SPREAD`` or more (pure)."""
    if not targets.is_floating_point() or targets.dim() < 2 or targets[0].numel() < 2 or len(targets) < MIN_SAMPLES:
        return None
    rms = targets.detach().float().reshape(len(targets), -1).pow(2).mean(1).sqrt()
    low, high = (float(q) for q in torch.quantile(rms, torch.tensor([0.1, 0.9])))
    return (low, high) if low > 0 and high >= SPREAD * low else None


def targets_normalised_per_sample(targets: torch.Tensor) -> str | None:
    """How float regression targets were normalised with each sample's own statistics, when
    every sample (each channel of a (B, K, C) chunk along K) spans exactly [-1, 1] or [0, 1],
    or sits at mean 0 and std 1; None otherwise (pure)."""
    if not targets.is_floating_point() or targets.dim() not in (2, 3) or len(targets) < MIN_SAMPLES:
        return None
    rows = targets.detach().float()
    rows = rows.transpose(1, 2).reshape(-1, rows.shape[1]) if rows.dim() == 3 else rows
    if rows.shape[1] < 4:
        return None
    varying = rows.amax(1) - rows.amin(1) > EXACT
    if int(varying.sum()) < MIN_SAMPLES:
        return None
    rows = rows[varying]
    # Multi-hot / one-hot rows span [0, 1] by nature: only rows with values between the ends count.
    inner = ((rows - rows.amin(1, keepdim=True)).abs() > EXACT) & ((rows - rows.amax(1, keepdim=True)).abs() > EXACT)
    if float(inner.any(1).double().mean()) < 0.9:
        return None
    low, high = rows.amin(1), rows.amax(1)
    if bool(((high - 1).abs() < EXACT).all()):
        for bottom, span in ((-1.0, "[-1, 1]"), (0.0, "[0, 1]")):
            if bool(((low - bottom).abs() < EXACT).all()):
                return f"min-max scaled to {span} with its own minimum and maximum"
    if bool((rows.mean(1).abs() < EXACT).all()) and (bool(((rows.std(1) - 1).abs() < EXACT).all())
                                                      or bool(((rows.std(1, unbiased=False) - 1).abs() < EXACT).all())):
        return "standardised with its own mean and std"
    return None


class SampleStandardisedCheck(Check):
    """INPUTS_STANDARDISED_PER_SAMPLE: each input at its own mean 0 and std 1, targets of varying scale;
    TARGETS_NORMALISED_PER_SAMPLE: each regression target normalised by its own statistics."""

    name = "data.sample_standardised"
    stage = Stage.DATA
    codes = ("INPUTS_STANDARDISED_PER_SAMPLE", "TARGETS_NORMALISED_PER_SAMPLE")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        pair = inputs_beside_labels(ctx.artifacts.first_batch)
        if pair is None or not all(isinstance(t, torch.Tensor) and t.layout == torch.strided for t in pair) \
                or not pair[0].is_floating_point() or min(pair[0].dim(), pair[1].dim()) < 1 \
                or len(pair[0]) != len(pair[1]):
            findings.data["summary"] = "no (inputs, targets) batch of floats"
            return
        inputs, targets = pair
        if (how := targets_normalised_per_sample(targets)) is not None:
            findings.data["summary"] = f"every target {how}"
            findings.warning(
                "TARGETS_NORMALISED_PER_SAMPLE",
                f"every regression target in the first batch (each sample{', each channel along dim 1,' if targets.dim() == 3 else ''} "
                f"of its {tuple(targets.shape[1:])} values) is {how}: each sample was normalised by its own statistics "
                "(a min-max or z-score per action chunk, per window, per curve), which erases its offset and scale. "
                "The model learns only shapes, and nothing at inference can undo a normalisation whose statistics "
                "came from the unknown target itself (un-normalising with dataset statistics does not invert it)",
                "Normalise targets with statistics computed once over the training set (per dimension: lo, hi = "
                "train_targets.amin(0), train_targets.amax(0), or mean / std), the same for every sample and split, "
                "and invert with those statistics at inference.",
                "data.train",
            )
        channels = standardised_channels(inputs)
        spread = target_scale_spread(targets) if channels else None
        findings.data["summary"] = (f"{len(channels)} input channel(s) standardised per sample" if spread is None
                                    else "inputs standardised per sample, targets of varying scale")
        if spread is None:
            return
        low, high = spread
        which = "every input" if inputs.dim() == 2 else f"input channel(s) {', '.join(map(str, channels))} of every sample"
        findings.warning(
            "INPUTS_STANDARDISED_PER_SAMPLE",
            f"{which} in the first batch sits at mean 0 and std 1 exactly: each sample was standardised with its own "
            "mean and std ((a - a.mean()) / a.std() in __getitem__, an instance normalisation), which erases its "
            f"offset and amplitude, while the targets' size varies {high / low:.0f}-fold across samples (per-sample "
            f"RMS {low:.3g} at the 10th percentile, {high:.3g} at the 90th). The model sees inputs that all look "
            "alike in scale and cannot tell which output size each needs",
            "Standardise with statistics computed once over the training set (mean, std = train_inputs.mean(), "
            "train_inputs.std(); x = (a - mean) / std for every sample and split), or give the model the sample's "
            "own mean and std as extra inputs.",
            "data.train",
        )
