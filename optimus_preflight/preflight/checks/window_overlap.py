"""Sliding windows of one series split at random between training and validation
(``data.window_overlap``).

``WINDOWS_SPLIT_AT_RANDOM``: windows cut from a series with a stride smaller than their
length overlap their neighbours; a random split (``train_test_split(windows, shuffle=True)``,
``random_split``) then puts, for almost every validation window, a training window that
shares all but a step or two of its values. The validation score measures how well the
model remembers the series, not how it forecasts: "too good to be true" until the model meets
new data.

Read from the data: the inputs of up to 2048 training and 512 validation samples (float
``(B, T)`` or ``(B, T, F)`` windows, T of 8 or more). A validation window whose values from
step ``s`` on equal a training window's values up to ``T - s`` (or the other way round), for a
shift ``s`` of 1 to 4, is an overlapping neighbour: float values cut from one series match
exactly, and nothing else does. A split in time overlaps only at its boundary (at most
``T - 1`` windows), far under the ``SHARE`` of the validation windows it takes to fire.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.split_scale import inputs_beside_labels
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

TRAIN_SAMPLES, VAL_SAMPLES = 2048, 512
BUDGET_S = 2.0
MIN_STEPS = 8
MAX_SHIFT = 4
SHARE = 0.25  # of the validation windows read with an overlapping training window
MIN_MATCHES = 5
CHANCE_RATIO = 3  # shifted matches must outnumber in-place ones this many times: not rows of a few values


def _windows(batch: Any) -> torch.Tensor | None:
    pair = inputs_beside_labels(batch)
    x = pair[0] if pair is not None else None
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() not in (2, 3) or x.shape[1] < MIN_STEPS:
        return None
    return x.detach().float().cpu().contiguous()


def _keys(windows: torch.Tensor, shift: int, head: bool) -> list[bytes]:
    part = windows[:, : windows.shape[1] - shift] if head else windows[:, shift:]
    return [row.numpy().tobytes() for row in part.contiguous()]


def overlapping(train: torch.Tensor, val: torch.Tensor) -> tuple[int, int, int] | None:
    """(validation windows with an overlapping training window, the smallest shift seen, and
    the control: validation windows whose same steps, unshifted, equal a training window's),
    whole copies of a training window left out of both (pure). Windows of one series match shifted, never
    in place; rows of a few repeated values (counts of a bag of words, zeros) match either
    way, by chance."""
    if train.shape[1:] != val.shape[1:]:
        return None
    hit = torch.zeros(len(val), dtype=torch.bool)
    control = torch.zeros(len(val), dtype=torch.bool)
    whole = set(_keys(train, 0, True))
    copied = torch.tensor([key in whole for key in _keys(val, 0, True)])
    smallest = None
    for shift in range(1, min(MAX_SHIFT, train.shape[1] // 4) + 1):
        train_heads, train_tails = set(_keys(train, shift, True)), set(_keys(train, shift, False))
        val_heads, val_tails = _keys(val, shift, True), _keys(val, shift, False)
        later = torch.tensor([key in train_heads for key in val_tails])  # val continues a training window
        earlier = torch.tensor([key in train_tails for key in val_heads])
        found = later | earlier
        if bool(found.any()) and smallest is None:
            smallest = shift
        hit |= found
        control |= torch.tensor([key in train_heads for key in val_heads]) | torch.tensor(
            [key in train_tails for key in val_tails])
    # A window that is a whole copy of a training window is data.split_overlap's business.
    return int((hit & ~copied).sum()), smallest or 0, int((control & ~copied).sum())


class WindowOverlapCheck(Check):
    """WINDOWS_SPLIT_AT_RANDOM: validation windows that overlap training windows by all but a step."""

    name = "data.window_overlap"
    stage = Stage.DATA
    codes = ("WINDOWS_SPLIT_AT_RANDOM",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no float windows with a validation loader"
        if ctx.val_loader is None or _windows(ctx.artifacts.first_batch) is None:
            return
        train = read_samples(ctx, self.name, findings, ctx.train_loader, f"training windows for {self.name}", _windows,
                             TRAIN_SAMPLES, BUDGET_S)
        val = read_samples(ctx, self.name, findings, ctx.val_loader, f"validation windows for {self.name}", _windows,
                           VAL_SAMPLES, BUDGET_S)
        if not train or not val or len({p.shape[1:] for p in train + val}) != 1:
            return
        train_windows, val_windows = torch.cat(train), torch.cat(val)
        found = overlapping(train_windows, val_windows)
        if found is None:
            return
        matches, shift, in_place = found
        share = matches / len(val_windows)
        findings.data.update(overlapping=matches, val_windows=len(val_windows), share=round(share, 3),
                             matching_in_place=in_place)
        findings.data["summary"] = f"{matches} of {len(val_windows)} validation windows overlap a training window"
        if matches < MIN_MATCHES or share < SHARE or in_place * CHANCE_RATIO > matches:
            return
        steps = train_windows.shape[1]
        findings.warning(
            "WINDOWS_SPLIT_AT_RANDOM",
            f"{matches} of the {len(val_windows)} validation windows read ({share:.0%}) share all but {shift} of their "
            f"{steps} steps with a training window (the same values, shifted by {shift}): overlapping sliding windows of "
            "one series were split at random (train_test_split(windows, shuffle=True), random_split), so nearly "
            "every validation window has its neighbour in training. The validation score measures memory of the "
            "series, not forecasting, and is too good to be true",
            f"Split by time: the windows of the last part of the series go to validation, with a gap of {steps} steps "
            "(the window length) between the splits, or split by series/entity when there are several.",
            "data.val",
        )
