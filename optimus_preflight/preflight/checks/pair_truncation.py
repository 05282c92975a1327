"""Sentence pairs cut at a fixed length after they were joined (``data.pair_truncation``).

``PAIR_SECOND_SEGMENT_CUT``: ``[CLS] premise [SEP] hypothesis [SEP]`` encoded and then cut
with ``ids[:max_len]``: whenever the first segment is long, the second one (the claim, the
question, the hypothesis) loses its end or disappears, and with it whatever the label says
about the pair. A tokenizer's own pair truncation (``truncation='only_first'`` or
``'longest_first'``) shortens the first segment and keeps both separators.

Read from the token ids of up to ``ROWS`` training rows: every row opens with the same token
([CLS]); a separator is an id that ends the real tokens of rows four times as often as its
share of the other positions predicts, and occurs exactly twice in those rows (complete
pairs). The check fires when a quarter of the rows or more fill the
whole width (no padding), do not end with the separator and hold it fewer than twice: their
second segment was cut. Single sentences (one separator), packed language-model chunks (no
common first token) and pairs truncated by the tokenizer stay quiet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.checks.attention_mask import padding_of
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

ROWS = 256
BUDGET_S = 2.0  # an upper limit on the read, never reached by an in-memory loader
MIN_COMPLETE = 4  # rows that show the pair layout: [CLS] a [SEP] b [SEP]
CUT_SHARE = 0.25  # of the rows, full width and missing the closing separator
ENDS_OVER_CHANCE = 4.0  # rows ending with the separator, against its share of the interior positions


def token_ids(batch: Any) -> torch.Tensor | None:
    """The (B, T) integer token ids of a mapping's ``input_ids`` or a tuple's first tensor."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else (
        batch[0] if isinstance(batch, (list, tuple)) and batch else None)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool \
            or ids.shape[1] < 8 or bool(((ids == 0) | (ids == 1)).all()):
        return None
    return ids.detach().long().cpu()


def cut_pairs(ids: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(separator id, complete pairs, rows cut before their closing separator, rows) (pure)."""
    if len(ids) < 8 or not bool((ids[:, 0] == ids[0, 0]).all()):
        return None
    padding = padding_of(ids)
    if padding is None:
        padding = torch.zeros_like(ids, dtype=torch.bool)
    elif bool(padding[:, 0].any()):
        return None  # left padding: the rows' ends are all at the last position
    length = (~padding).sum(1)
    full = length == ids.shape[1]
    last = ids[torch.arange(len(ids)), (length - 1).clamp(min=0)]
    pad = int(ids[padding][0]) if bool(padding.any()) else None
    positions = torch.arange(ids.shape[1])
    interior = (positions[None, :] > 0) & (positions[None, :] < (length - 1)[:, None])
    best = None
    for separator in torch.unique(last).tolist():
        if separator in (pad, int(ids[0, 0])):
            continue
        counts = (ids == separator).sum(1)
        if int(counts.max()) > 2:
            continue  # an ordinary token, not a separator
        # A separator ends rows far more often than its share of the other positions predicts;
        # an ordinary token ends them by chance.
        chance = float(((ids == separator) & interior).sum()) / max(int(interior.sum()), 1) * len(ids)
        if int((last == separator).sum()) < ENDS_OVER_CHANCE * chance:
            continue
        complete = int(((last == separator) & (counts == 2)).sum())
        cut = int((full & (last != separator) & (counts < 2)).sum())
        if complete >= MIN_COMPLETE and (best is None or cut > best[2]):
            best = (int(separator), complete, cut, len(ids))
    return best if best is not None and best[2] >= CUT_SHARE * best[3] else None


class PairTruncationCheck(Check):
    """PAIR_SECOND_SEGMENT_CUT: sentence pairs cut at a fixed length after joining."""

    name = "data.pair_truncation"
    stage = Stage.DATA
    codes = ("PAIR_SECOND_SEGMENT_CUT",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        first = token_ids(ctx.artifacts.first_batch)
        if first is None or not bool((first[:, 0] == first[0, 0]).all()):
            # Only encoded pairs open every row with one token ([CLS]); anything else is not read on.
            findings.data["summary"] = "no (B, T) token ids opening with one [CLS] token"
            return
        parts = read_samples(ctx, self.name, findings, ctx.train_loader, "token ids for pair truncation", token_ids,
                             ROWS, BUDGET_S)
        widths = {part.shape[1] for part in parts or []}
        if not parts or len(widths) != 1:
            findings.data["summary"] = "batches of varying width: nothing is cut to one length"
            return
        found = cut_pairs(torch.cat(parts))
        if found is None:
            findings.data["summary"] = "no pair cut before its closing separator"
            return
        separator, complete, cut, rows = found
        findings.data["summary"] = f"{cut} of {rows} rows lose their second segment"
        findings.warning(
            "PAIR_SECOND_SEGMENT_CUT",
            f"{cut} of {rows} training rows fill all {widths.pop()} positions and lack their closing separator (id "
            f"{separator}), which ends the {complete} complete rows as [CLS] first [SEP] second [SEP]: the pairs were "
            "truncated to a fixed length after they were joined (ids[:max_len]), so a long first segment cuts the "
            "second one (the claim, question or hypothesis) short or drops it, and the label can no longer be read "
            "from what is left",
            "Truncate the first segment only: tokenizer(first, second, truncation='only_first', max_length=...) "
            "(or 'longest_first'), or cut the first segment's tokens to max_len - len(second) - 3 before joining.",
            "data.train",
        )
