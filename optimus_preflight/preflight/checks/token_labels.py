"""Token-classification labels that stop before the tokens do (``step.token_labels``).

Word-level tags (NER, POS) must be re-aligned to a sub-word tokenizer's pieces: through
``word_ids()``, each word's first piece gets its tag and the other pieces, ``[CLS]``,
``[SEP]`` and padding get -100. Laid one per position instead, ``[-100] + tags + [-100] * k``,
the tags fill a contiguous run that ends where the words would end without sub-words, long
before the tokens do, and every tag after the first split word sits on the wrong token.

Read from a batch holding token ids and labels of one (B, T) shape: a mapping's
``input_ids``, ``attention_mask`` and ``labels``, or an ``(ids, labels)`` tuple whose labels
hold -100 (the real tokens are then what is not edge padding). Per row: the trained labels
(not -100) and the real tokens. Tags are class ids, far below the token ids; labels that are
token ids themselves (a seq2seq target, an LM's) are another task and are not read. A row is
short when its trained labels form one unbroken run that ends well before its last real
token: at least ``SHORT_BY`` positions and a quarter of the row. Aligned labels have gaps
(the extra pieces) and end at the last word, one to three positions before ``[SEP]``;
prompt-completion labels end at the last token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.token_tags import MIN_POSITIONS, ids_and_tags, tag_offset
from optimus_preflight.preflight.checks.attention_mask import padding_of
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

IGNORE_INDEX = -100  # what Hugging Face token classifiers ignore
SHORT_BY = 3  # positions between the last trained label and the last real token
SHORT_SHARE = 0.25  # ... and at least this share of the row's real tokens
ROWS_SHARE = 0.75  # of the rows with trained labels
MIN_ROWS = 4


@dataclass
class LabelSpan:
    rows: int  # rows with trained labels
    short: int  # of them, rows whose labels are one run ending early
    median_labelled: float  # trained labels over real tokens, median over the short rows
    example: tuple[int, int]  # (last labelled position, last real token) of the first short row


def label_span(input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> LabelSpan | None:
    """Where each row's trained labels end against its real tokens (pure); None when the
    tensors are not (B, T) token ids, mask and labels of one shape."""
    if not (input_ids.shape == attention_mask.shape == labels.shape) or labels.dim() != 2 \
            or labels.is_floating_point() or input_ids.is_floating_point():
        return None
    rows = short = 0
    shares: list[float] = []
    example = (-1, -1)
    positions = torch.arange(labels.shape[1])
    for row_labels, row_mask in zip(labels.cpu(), attention_mask.cpu(), strict=True):
        trained = row_labels != IGNORE_INDEX
        real = row_mask != 0
        if not bool(trained.any()) or not bool(real.any()):
            continue
        rows += 1
        labelled = positions[trained]
        first, last = int(labelled.min()), int(labelled.max())
        last_token = int(positions[real].max())
        unbroken = int(trained.sum()) == last - first + 1
        length = int(real.sum())
        if unbroken and last_token - last >= max(SHORT_BY, SHORT_SHARE * length):
            short += 1
            shares.append(int(trained.sum()) / length)
            if example == (-1, -1):
                example = (last, last_token)
    if rows < MIN_ROWS:
        return None
    median = float(torch.tensor(shares).median()) if shares else 0.0
    return LabelSpan(rows, short, median, example)


def ids_mask_labels(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(token ids, real-token mask, labels) of a token-classification batch, or None."""
    if isinstance(batch, Mapping):
        ids, mask, labels = batch.get("input_ids"), batch.get("attention_mask"), batch.get("labels")
    elif isinstance(batch, (list, tuple)):
        grids = [leaf for leaf in batch if isinstance(leaf, torch.Tensor) and leaf.dim() == 2
                 and not leaf.is_floating_point() and leaf.dtype != torch.bool]
        marked = [grid for grid in grids if bool((grid == IGNORE_INDEX).any())]
        plain = [grid for grid in grids if not bool((grid == IGNORE_INDEX).any())]
        if len(marked) != 1 or not plain:
            return None
        labels, ids, mask = marked[0], plain[0], None
    else:
        return None
    if not isinstance(ids, torch.Tensor) or not isinstance(labels, torch.Tensor) or ids.shape != labels.shape \
            or ids.dim() != 2:
        return None
    if not isinstance(mask, torch.Tensor):
        pad = padding_of(ids)
        mask = ~pad if pad is not None else torch.ones_like(ids, dtype=torch.bool)
    trained = labels[labels != IGNORE_INDEX]
    # Tags are a handful of class ids; labels in the token ids' own range are tokens (seq2seq, LM).
    if not trained.numel() or int(trained.max()) * 2 > int(ids.max()):
        return None
    return ids, mask, labels


OFFSET_ROWS = 512  # rows read for the offset when the first batches hold too few tags
OFFSET_BUDGET_S = 5.0  # an upper limit on that read, never reached by an in-memory loader


def padded_rows(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, tags) of batches padded per batch to their own lengths, stacked to the longest:
    ids with 0 and tags with -100, which no agreement counts."""
    length = max(ids.shape[1] for ids, _ in pairs)
    ids = torch.cat([torch.nn.functional.pad(i, (0, length - i.shape[1]), value=0) for i, _ in pairs])
    tags = torch.cat([torch.nn.functional.pad(t, (0, length - t.shape[1]), value=IGNORE_INDEX) for _, t in pairs])
    return ids, tags


class TokenLabelsCheck(Check):
    """TOKEN_LABELS_NOT_ALIGNED: word tags laid one per position on a sub-word sequence."""

    name = "step.token_labels"
    stage = Stage.STEP
    codes = ("TOKEN_LABELS_NOT_ALIGNED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        found = ids_mask_labels(ctx.artifacts.first_batch)
        if found is None or getattr(getattr(ctx.model, "config", None), "is_encoder_decoder", False):
            findings.data["summary"] = "no token ids with per-token labels"
            return
        if self._offset(ctx, findings):
            return
        span = label_span(*found)
        if span is None:
            findings.data["summary"] = "labels are not per-token (B, T) beside the input ids"
            return
        findings.data.update(rows=span.rows, short_rows=span.short)
        findings.data["summary"] = f"{span.short} of {span.rows} rows' labels end before their tokens"
        if span.short < ROWS_SHARE * span.rows:
            return
        last, last_token = span.example
        findings.warning(
            "TOKEN_LABELS_NOT_ALIGNED",
            f"the token labels stop long before the tokens: in {span.short} of {span.rows} rows the trained labels "
            f"(not -100) are one unbroken run covering a median {span.median_labelled:.0%} of the real tokens and "
            f"ending before the last one (e.g. at position {last}, the tokens at {last_token}). Word-level tags laid "
            "one per position on a sub-word (word-piece) sequence do this: as soon as a word is split into pieces, "
            "every later tag sits on the wrong token, and the model is trained on labels shifted against its inputs",
            "Align the word tags to the tokens with the tokenizer's word_ids(): give each word's first piece its "
            "tag and every other piece, [CLS], [SEP] and padding -100 (label_all_tokens=False in the Hugging Face "
            "token-classification example), or tokenize with is_split_into_words=True and map through word_ids().",
        )

    @staticmethod
    def _offset(ctx: PreflightContext, findings: Findings) -> bool:
        """TOKEN_LABELS_NOT_ALIGNED by an offset: each tag told by the token k positions away."""
        batches = [pair for batch in (ctx.artifacts.window_batches or [ctx.artifacts.first_batch])
                   if (pair := ids_and_tags(batch)) is not None]
        if not batches:
            return False
        if sum(int((tags >= 0).sum()) for _, tags in batches) < 2 * MIN_POSITIONS:
            # A batch of short sentences holds too few tags to compare offsets: read on.
            more = read_samples(ctx, "step.token_labels", findings, ctx.train_loader, "token tags for the offset",
                                ids_and_tags, OFFSET_ROWS, OFFSET_BUDGET_S)
            batches = more or batches
        found = tag_offset(*padded_rows(batches))
        if found is None:
            return False
        offset, shifted, in_place, majority = found
        findings.data["summary"] = f"each tag matches the token {offset:+d} position(s) away"
        where = "after" if offset > 0 else "before"
        cause = (" The word tags were written from position 0, over [CLS], instead of from the first word's "
                 "position" if offset == 1 else "")
        findings.warning(
            "TOKEN_LABELS_NOT_ALIGNED",
            f"the token labels are shifted against the tokens: the tag at each position is told by the token "
            f"{abs(offset)} position(s) {where} it ({shifted:.0%} agreement with that token's usual tag, "
            f"{in_place:.0%} with the token in place, {majority:.0%} for always answering the commonest tag), so "
            f"the model learns to predict each token's tag from its neighbour.{cause}",
            "Lay each word's tag on its own token: start the tags at the first word's position (after [CLS], "
            "labels[1:n + 1] = tags) and give [CLS], [SEP] and padding -100; with a sub-word tokenizer map the tags "
            "through word_ids().",
        )
        return True
