"""A "next" tensor that holds the previous row of another (``data.row_shift``).

Transitions and forecasting pairs are built by shifting a logged sequence against itself:
``next_obs = obs[1:]`` beside ``obs[:-1]``, or ``torch.roll(obs, -1, 0)``. ``torch.roll(obs, 1,
0)`` shifts the other way: every row's "next" observation is the one before it, so a TD target
bootstraps from ``s_{t-1}`` and a forecaster is taught the past. Shapes, dtypes and values all
look right.

Read from the training dataset in index order: two float tensors of one shape in each sample,
the later of which equals the earlier one's previous row in nearly every row (and differs from
its own row). The previous row's value in the next tensor is the direction's mistake; the
following row's is the correct shift and stays quiet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.data_access.samples import ordered_loader
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

ROWS = 512
MIN_ROWS = 32
SHARE = 0.9  # of the rows whose "next" value is the previous row's
BUDGET_S = 2.0
MAX_VALUES = 256  # per row


def float_fields(batch: Any) -> tuple[torch.Tensor, ...] | None:
    """Each field of a tuple batch as (rows, values) floats; an empty tensor for the others."""
    if not isinstance(batch, (list, tuple)) or not batch or not isinstance(batch[0], torch.Tensor):
        return None
    rows = len(batch[0])
    # a row's first values say whether it equals another row: images need not be read whole
    return tuple(t.detach().reshape(rows, -1)[:, :MAX_VALUES].float().cpu() if isinstance(t, torch.Tensor)
                 and t.layout == torch.strided and t.is_floating_point() and t.dim() >= 1 and len(t) == rows
                 else torch.empty(rows, 0) for t in batch)


def shifted_back(earlier: torch.Tensor, later: torch.Tensor) -> float | None:
    """The share of rows whose ``later`` value is ``earlier``'s previous row (pure), when the
    two are distinct tensors of one shape; None otherwise."""
    if earlier.shape != later.shape or earlier.dim() != 2 or len(earlier) < MIN_ROWS or earlier.shape[1] == 0:
        return None
    same_row = (later == earlier).all(1).float().mean()
    if float(same_row) > 1 - SHARE:
        return None
    return float((later[1:] == earlier[:-1]).all(1).float().mean())


class RowShiftCheck(Check):
    """NEXT_ROWS_BACKWARD: a 'next' tensor built by shifting its sequence the wrong way."""

    name = "data.row_shift"
    stage = Stage.DATA
    codes = ("NEXT_ROWS_BACKWARD",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        dataset = getattr(ctx.train_loader, "dataset", None)
        first = float_fields(ctx.artifacts.first_batch)
        shapes = [tuple(t.shape[1:]) for t in first or () if t.shape[1] > 0]
        if dataset is None or isinstance(dataset, IterableDataset) or not first or len(shapes) == len(set(shapes)):
            findings.data["summary"] = "no two float fields of one shape"
            return
        parts = read_samples(ctx, self.name, findings, ordered_loader(ctx.train_loader), f"training samples in order for {self.name}",
                             float_fields, ROWS, BUDGET_S)
        if not parts:
            findings.data["summary"] = "the samples could not be read in order"
            return
        fields = [torch.cat([part[k] for part in parts]) for k in range(len(parts[0]))]
        for i, earlier in enumerate(fields):
            for j in range(i + 1, len(fields)):
                share = shifted_back(earlier, fields[j])
                if share is None or share < SHARE:
                    continue
                findings.data["summary"] = f"batch[{j}] is batch[{i}] one row back"
                findings.warning(
                    "NEXT_ROWS_BACKWARD",
                    f"in dataset order, batch[{j}] of row k equals batch[{i}] of row k - 1 in {share:.0%} of "
                    f"{len(earlier)} rows: the 'next' tensor holds the PREVIOUS row. A shift built with torch.roll(x, 1, "
                    "dims=0) (or x[:-1] placed beside x[1:]) moves the sequence the wrong way, so each transition's "
                    "next state is s_{t-1} and a TD target (or a forecast) learns from the past instead of the future",
                    "Shift forward: next_obs = torch.roll(obs, -1, dims=0) (then drop or mask the last row of each "
                    "episode), or pair obs[:-1] with obs[1:].",
                    "data.train",
                )
                return
        findings.data["summary"] = "no field holds another's previous row"
