"""Frame labels at another rate than their feature frames (``data.frame_labels``).

Sound-event detection, frame-level speech labels and video action segmentation pair ``T``
feature frames with ``T`` labels. Annotations are often made at a finer hop (10 ms labels for
20 ms features); cutting them to the first ``T`` entries (``labels[:, :T]``) instead of
resampling (``labels[:, ::2]``) gives frame ``t`` the label of time ``t / 2``: every event is
labelled early and short, the second half of each clip's labels is lost. Shapes agree.

Read from the first batch of ``(features, labels)``: integer ``(B, T)`` labels beside float
``(B, C, T)`` (or ``(B, T, C)``) features. Per sample, the strongest correlation between one
feature channel and one class's indicator over the frames is measured for the labels as given
and read at 2, 3 and 4 times their rate (``labels[s * t]``), on the same first frames, and for the
re-read labels against another clip's frames (the chance level). Where events show in the
features, labels on the right rate lie on them best as given; labels at a finer hop lie on them
only when read faster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.split_scale import inputs_beside_labels
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_FRAMES = 16
MAX_CLASSES = 16
MAX_CHANNELS = 128
SAMPLES = 32
RATES = (2, 3, 4)
STRONG = 0.4  # correlation of the better reading with a feature channel
GAIN, RATIO = 0.2, 1.3  # what the re-read labels must win by, over the labels as given
MIN_SAMPLES, MIN_SHARE = 4, 0.25


def frames_and_labels(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
    """The features as (B, C, T) on the labels' T frames, or None."""
    if not features.is_floating_point() or features.dim() != 3 or labels.dim() != 2 or labels.is_floating_point() \
            or labels.dtype == torch.bool or len(features) != len(labels) or labels.shape[1] < MIN_FRAMES:
        return None
    frames = labels.shape[1]
    if features.shape[2] == frames and features.shape[1] <= MAX_CHANNELS:
        return features
    if features.shape[1] == frames and features.shape[2] <= MAX_CHANNELS:
        return features.transpose(1, 2)
    return None


def lies_on(features: torch.Tensor, labels: torch.Tensor) -> float:
    """The strongest |correlation| over the frames between one of ``features`` (C, T) channels and
    one class indicator of ``labels`` (T,) (pure)."""
    frames = features - features.mean(1, keepdim=True)
    norms = frames.norm(dim=1).clamp_min(1e-12)
    best = 0.0
    for label in torch.unique(labels)[:MAX_CLASSES]:
        indicator = (labels == label).float()
        if float(indicator.std()) == 0:
            continue
        indicator = indicator - indicator.mean()
        best = max(best, float(((frames @ indicator) / (norms * indicator.norm())).abs().max()))
    return best


def faster_rate(features: torch.Tensor, labels: torch.Tensor) -> tuple[int, int, int] | None:
    """(rate, samples whose labels lie on their frames far better read at that rate, samples
    scored) when that is a good share of them (pure)."""
    rates = [rate for rate in RATES if labels.shape[1] // rate >= MIN_FRAMES]
    wins = dict.fromkeys(rates, 0)
    scored = 0
    features, labels = features[:SAMPLES].float(), labels[:SAMPLES]
    for index, (frames, row) in enumerate(zip(features, labels, strict=True)):
        other = features[(index + 1) % len(features)]  # another clip's frames: the chance level
        read = {}
        for rate in rates:
            length = -(-len(row) // rate)
            own = lies_on(frames[:, :length], row[::rate])
            # the labels as given on the same first frames, and the re-read ones on another clip's
            given, chance = lies_on(frames[:, :length], row[:length]), lies_on(other[:, :length], row[::rate])
            read[rate] = (own, given, chance)
        if not read:
            break
        rate = max(read, key=lambda r: read[r][0])
        own, given, chance = read[rate]
        if max(given, own) < STRONG:
            continue
        scored += 1
        if own >= given + GAIN and own >= RATIO * given and own >= chance + GAIN:
            wins[rate] += 1
    if not wins:
        return None
    rate = max(wins, key=wins.get)
    if scored and wins[rate] >= MIN_SAMPLES and wins[rate] >= MIN_SHARE * scored:
        return rate, wins[rate], scored
    return None


class FrameLabelsCheck(Check):
    """FRAME_LABELS_OTHER_RATE: frame labels that lie on their features only read at a faster rate."""

    name = "data.frame_labels"
    stage = Stage.DATA
    codes = ("FRAME_LABELS_OTHER_RATE",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        pair = inputs_beside_labels(ctx.artifacts.first_batch)
        features = frames_and_labels(*pair) if pair is not None and all(
            isinstance(t, torch.Tensor) and t.layout == torch.strided for t in pair) else None
        if features is None:
            findings.data["summary"] = "no (features, frame labels) batch"
            return
        found = faster_rate(features.detach().cpu(), pair[1].detach().cpu())
        findings.data["summary"] = "frame labels lie on their frames" if found is None else "frame labels at another rate"
        if found is None:
            return
        rate, wins, scored = found
        frames = pair[1].shape[1]
        findings.warning(
            "FRAME_LABELS_OTHER_RATE",
            f"in {wins} of {scored} samples of the first batch the frame labels lie on their features far better read "
            f"at {rate} times their rate (labels[{rate} * t] against frame t) than as given: the labels were made at a "
            f"{rate}x finer hop than the {frames} feature frames and cut to the first {frames} entries "
            f"(labels[:, :{frames}]) instead of resampled, so frame t carries the label of time t / {rate}, every "
            "event is labelled early and short, and the end of each clip has no labels of its own",
            f"Resample the labels to the feature frame rate: labels[:, ::{rate}] (or map each feature frame's centre "
            "time to the annotation at that time) rather than truncating them to the number of frames.",
            "data.train",
        )
