"""A collate function that cuts the sequences it batches (``data.collate_truncation``).

``COLLATE_TRUNCATES``: the dataset's items are token sequences of widely varying length,
but each collated batch is only as wide as its shortest ones: ``width = min(lengths)`` "to
avoid padding" cuts every longer sequence to it, so most of each text never reaches the
model. Read from the data, not the code: the lengths of a spread of raw items
(``dataset[i]``) against the widths of a few batches. A fixed ``max_length`` truncation
gives every batch the same width and stays quiet; padding to the longest gives batches at
least as wide as most items.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

ITEMS = 32  # raw items read, spread over the dataset
BATCHES = 3  # batches whose widths are compared
SHORT = 0.25  # every batch width at or under this quantile of the item lengths (a batch of 32 has its
# shortest under the lower quartile but for a 1e-4 chance; under the 10th percentile it missed 3% of the time) ...
LONG = 2.0  # ... while the median item is this many times wider than the widest batch


def token_rows(batch: Any) -> torch.Tensor | None:
    """The batch's first (B, W) integer tensor: token ids."""
    return next((leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.dim() == 2
                 and not leaf.is_floating_point() and leaf.dtype != torch.bool and leaf.shape[1] >= 2), None)


def _sequence_length(item: Any) -> int | None:
    """The length of an item's first 1-D integer tensor (or list of ints)."""
    for leaf in leaves(item):
        if isinstance(leaf, torch.Tensor) and leaf.dim() == 1 and not leaf.is_floating_point() and leaf.numel() > 1:
            return int(leaf.numel())
    if isinstance(item, (tuple, list)) and item and isinstance(item[0], list) and all(isinstance(v, int) for v in item[0]):
        return len(item[0])
    return None


class CollateTruncationCheck(Check):
    """COLLATE_TRUNCATES: batches as narrow as their shortest sequences."""

    name = "data.collate_truncation"
    stage = Stage.DATA
    codes = ("COLLATE_TRUNCATES",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader, first = ctx.train_loader, token_rows(ctx.artifacts.first_batch)
        dataset = getattr(loader, "dataset", None)
        findings.data["summary"] = "no variable-length token sequences"
        if first is None or dataset is None or isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            return
        guard = DataGuard(ctx, self.name, findings)
        size = guard.call(len, dataset, what="len(dataset)")
        if size < ITEMS:
            return
        indices = [int(i * (size - 1) / (ITEMS - 1)) for i in range(ITEMS)]
        lengths = [_sequence_length(guard.call(operator.getitem, dataset, i, what=f"dataset[{i}]")) for i in indices]
        if any(length is None for length in lengths):
            return
        ordered = torch.tensor(sorted(lengths), dtype=torch.float)
        short, median = float(ordered.quantile(SHORT)), float(ordered.median())
        # More batches are read only when the first is already as narrow as the shortest items.
        if first.shape[1] > short or median < LONG * first.shape[1]:
            return
        widths = [first.shape[1]]
        with preserved_data_state(ctx), guard.batches(loader, "batch widths") as read:
            for _ in range(BATCHES):
                rows = token_rows(next(read, None))
                if rows is not None:
                    widths.append(rows.shape[1])
        findings.data.update(item_lengths=[int(ordered.min()), int(ordered.median()), int(ordered.max())], widths=widths)
        findings.data["summary"] = f"items {int(ordered.min())}-{int(ordered.max())} long, batches {widths} wide"
        # Equal widths are a fixed max_length, unless every batch is exactly as wide as the shortest
        # item read: then each batch held one of the shortest sequences and was cut to it.
        fixed_cap = len(set(widths)) < 2 and widths[0] != int(ordered.min())
        if fixed_cap or max(widths) > short or median < LONG * max(widths):
            return
        findings.warning(
            "COLLATE_TRUNCATES",
            f"the dataset's sequences are {int(ordered.min())} to {int(ordered.max())} tokens long (median "
            f"{int(ordered.median())}), but the batches are only {', '.join(map(str, widths))} wide, about as long as "
            "the shortest of each batch: the collate_fn cuts every sequence to the batch's shortest (width = "
            "min(lengths) 'to avoid padding'), so most of each text is dropped before the model sees it",
            "Pad to the longest sequence of the batch (width = max(lengths), or pad_sequence(..., batch_first=True, "
            "padding_value=pad_id)) and mask the padding, or truncate to a fixed max_length chosen for the data.",
        )
