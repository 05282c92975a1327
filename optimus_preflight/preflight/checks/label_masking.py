"""Labels masked by the pad id where the pad id is also a real token (``data.label_masking``).

``tokenizer.pad_token = tokenizer.eos_token`` is the usual recipe for GPT-2 style models.
Masking the labels with ``labels[input_ids == pad_token_id] = -100`` then removes every
real EOS from the targets too, not only the padding: the model is never trained to end a
sequence, and generation never stops. Masking by ``attention_mask == 0`` keeps them.

Read from a Hugging Face style batch: attended tokens of the padding's id whose label is
dropped right after a supervised one (an end token cut from the answer it ends).

The same batches' labels are read for where the answer sits (``analyses/answer_spans``):
labels that keep each row's start and drop its end, the prompt trained and the answer not
(``LABELS_ONLY_ON_PROMPT``); labels that are the row's own tokens moved by its padding, inputs
and labels padded on opposite sides (``LABELS_PADDED_APART``); answers that match the next
row's prompt better than their own, two lists zipped one row apart (``ANSWERS_ONE_ROW_OFF``);
rows all cut to one width behind a masked prompt, many keeping no label, the answers truncated
away (``ANSWERS_TRUNCATED``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.analyses.answer_spans import (
    IGNORE,
    copies_the_ids,
    ids_and_labels,
    pairing_overlap,
    prompt_only_rows,
    row_offsets,
)
from optimus_preflight.preflight.checks.batch_checks import is_map_style
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.data_access.samples import ordered_loader
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_ROWS_HIT = 0.5  # of the rows that have padding: each loses its real end token


NEXT_ROW_GAP = 0.2  # answers share this much more of the next row's prompt than of their own: pairs one row off
ORDERED_ROWS = 64  # training rows read in dataset order
FULL_ROWS = 0.9  # of the rows: no padding, every row as wide as the batch, each starting with a masked prompt
EMPTY_ROWS = 0.1  # of the rows keep no label at all
MIN_MASKED_ROWS = 8  # rows with both supervised and ignored real tokens before the layout is read
PROMPT_ONLY_SHARE = 0.8  # of those rows: the labels keep the start and drop the end
MAX_OFFSET_WIDTH = 256  # positions per row searched for the labels' offset
MIN_OFFSET_ROWS = 8


class LabelMaskingCheck(Check):
    """LABELS_MASK_REAL_TOKEN: the pad id is a real token the label mask removes; the answer
    spans: prompt-only labels, labels padded apart, answers one row off, answers truncated."""

    name = "data.label_masking"
    stage = Stage.DATA
    codes = ("LABELS_MASK_REAL_TOKEN", "LABELS_ONLY_ON_PROMPT", "LABELS_PADDED_APART", "ANSWERS_ONE_ROW_OFF",
             "ANSWERS_TRUNCATED")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = ctx.artifacts.first_batch
        self._prompt_only(batch, findings)
        found = ids_and_labels(batch)
        # Only labels that ignore part of the rows (a masked prompt, padding) hold answers to pair.
        if found is not None and bool((found[1] == IGNORE).any()):
            self._pairs_one_row_off(ctx, findings)
        if not isinstance(batch, Mapping):
            findings.data["summary"] = "not a mapping batch"
            return
        ids, mask, labels = (batch.get(key) for key in ("input_ids", "attention_mask", "labels"))
        if not all(isinstance(t, torch.Tensor) for t in (ids, mask, labels)) or not ids.shape == mask.shape == labels.shape:
            findings.data["summary"] = "no input_ids, attention_mask and labels of one shape"
            return
        padding = mask == 0
        if not bool(padding.any()):
            findings.data["summary"] = "no padding"
            return
        pad_id = int(torch.mode(ids[padding]).values)
        real_pad = (mask == 1) & (ids == pad_id)
        masked_real = real_pad & (labels == IGNORE)
        supervised = labels != IGNORE
        # The convention this reads: labels are the input ids themselves where they count (the
        # model shifts), so the token before a real end token is the answer's last one.
        unshifted = bool(supervised.any()) and float((labels[supervised] == ids[supervised]).float().mean()) >= 0.95
        before = torch.zeros_like(supervised)
        before[:, 1:] = supervised[:, :-1]
        # A pad-id token the labels drop right after a supervised token: an end token cut from the
        # answer it ends (a prompt masked to -100 ahead of it is no evidence either way).
        cut = masked_real & before if unshifted else masked_real
        if not bool(cut.any()) or (not unshifted and not bool((ids[(mask == 1) & (labels == IGNORE)] == pad_id).all())):
            findings.data["summary"] = "the label mask follows the padding"
            return
        if bool((real_pad & supervised).any()):
            findings.data["summary"] = "some attended tokens of the padding id keep their labels"
            return
        padded_rows = padding.any(dim=1)
        hit = (cut.any(dim=1) & padded_rows).sum()
        findings.data["summary"] = f"{int(masked_real.sum())} attended token(s) of id {pad_id} have no label"
        if int(hit) < MIN_ROWS_HIT * int(padded_rows.sum()):
            return
        findings.warning(
            "LABELS_MASK_REAL_TOKEN",
            f"the labels ignore the attended tokens of id {pad_id} in {int(hit)} of {int(padded_rows.sum())} padded "
            f"rows: id {pad_id} is the padding id and also a real token the sequences contain (the EOS, when "
            "tokenizer.pad_token = tokenizer.eos_token), so masking the labels by input_ids == pad_token_id removes "
            "every real end-of-sequence from the targets: the model never learns to stop",
            "Mask the labels by the attention mask: labels[attention_mask == 0] = -100 (the DataCollator for "
            "language modelling does this), or give the tokenizer its own pad token.",
            "data.train",
        )

    @staticmethod
    def _prompt_only(batch: object, findings: Findings) -> None:
        """Completion-only fine-tuning masks each row's prompt (its start) and trains on the
        answer that ends it; the mask written the other way round (``labels[len(prompt):] =
        -100``) trains on the prompts and never shows the model an answer."""
        found = ids_and_labels(batch)
        if found is None:
            return
        ids, labels, real = found
        if not copies_the_ids(ids, labels):
            if ids.shape[1] <= MAX_OFFSET_WIDTH:
                LabelMaskingCheck._padded_apart(ids[:32], labels[:32], real[:32], findings)
            return  # tags (token classification) or a decoder's targets (seq2seq): no prompt in them
        LabelMaskingCheck._answers_cut(labels, real, findings)
        head_only, mixed = prompt_only_rows(labels, real)
        findings.data["rows_labelled_at_their_start_only"] = head_only
        if mixed < MIN_MASKED_ROWS or head_only < PROMPT_ONLY_SHARE * mixed:
            return
        findings.warning(
            "LABELS_ONLY_ON_PROMPT",
            f"in {head_only} of the {mixed} rows whose labels ignore part of the real tokens, the labels keep the "
            "start of the row and ignore its end (two tokens or more, up to the last real token): the loss trains "
            "only on the prompt (instruction) tokens and never on the answer that ends each row. Completion-only "
            "fine-tuning masks the other side: labels[:len(prompt)] = -100 was meant, not labels[len(prompt):] = -100",
            "Mask the prompt, keep the answer: labels = input_ids.clone(); labels[:len(prompt_ids)] = -100 (and -100 "
            "on the padding); check one row: the ids where labels != -100 should decode to the answer.",
            "data.train",
        )

    @staticmethod
    def _padded_apart(ids: torch.Tensor, labels: torch.Tensor, real: torch.Tensor, findings: Findings) -> None:
        """Labels that are the row's own tokens, moved by as many positions as the row has
        padding: the inputs padded on one side (pad_sequence: right) and the labels on the other."""
        offsets = row_offsets(ids, labels)
        aligned = [o for o in offsets if o in (0, -1)]
        padding = (~real).sum(dim=1).tolist()
        moved = [(o, pad) for o, pad in zip(offsets, padding, strict=True) if o is not None and o not in (0, -1)]
        by_padding = [o for o, pad in moved if o in (pad, pad - 1, -pad, -pad - 1)]
        findings.data["rows_labelled_out_of_place"] = len(moved)
        if len(moved) < MIN_OFFSET_ROWS or len(by_padding) < 0.8 * len(moved) or len(moved) < 2 * len(aligned):
            return
        findings.warning(
            "LABELS_PADDED_APART",
            f"in {len(moved)} of {len(offsets)} rows the labels are the row's own tokens moved by as many positions "
            f"as the row has padding ({len(aligned)} rows line up, the full-length ones): the inputs are padded on "
            "one side and the labels on the other (pad_sequence right-pads input_ids; labels left-padded with "
            "torch.cat([fill, labels]) or a tokenizer with padding_side='left'), so every shorter row is trained "
            "to predict tokens at the wrong positions",
            "Pad the labels on the same side as the inputs: labels = torch.cat([labels, torch.full((T - len(labels),), "
            "-100)]) for right-padded input_ids (or pad both with one collator / one tokenizer padding_side).",
            "data.train",
        )

    @staticmethod
    def _pairs_one_row_off(ctx: PreflightContext, findings: Findings) -> None:
        """Prompts and answers read from two lists zipped one row apart (a header skipped in one
        export): read in dataset order, each answer shares far more tokens with the next row's
        prompt than with its own. Read from the training set in order and from the validation
        loader's first batch (built by the same code, usually in order)."""
        guard = DataGuard(ctx, "data.label_masking", findings)
        sources = []
        if is_map_style(getattr(ctx.train_loader, "dataset", None)):
            sources.append(("training", ordered_loader(ctx.train_loader, ORDERED_ROWS)))
        if ctx.val_loader is not None:
            sources.append(("validation", ctx.val_loader))
        for which, loader in sources:
            with preserved_data_state(ctx), guard.batches(loader, f"{which} prompts and answers in order") as batches:
                batch = next(batches, None)
            found = ids_and_labels(batch) if batch is not None else None
            overlap = pairing_overlap(*found) if found is not None else None
            if overlap is None:
                continue
            own, following = overlap
            findings.data[f"{which}_answer_overlap"] = {"own_prompt": round(own, 3), "next_prompt": round(following, 3)}
            if following - own < NEXT_ROW_GAP:
                continue
            findings.warning(
                "ANSWERS_ONE_ROW_OFF",
                f"read in dataset order, the {which} answers share {following:.0%} of their tokens with the NEXT row's "
                f"prompt and only {own:.0%} with their own: each row holds the answer to the next row's prompt. "
                "Prompts and answers read from two files or columns and zipped one row apart (a header line "
                "skipped in a file that has none, answers[1:]), so the model is trained on answers to other questions",
                "Pair each prompt with its own answer: read both from one record (one JSONL line, one table row), or "
                "check len(prompts) == len(answers) and print the first pairs before zipping them.",
                "data.train",
            )
            return

    @staticmethod
    def _answers_cut(labels: torch.Tensor, real: torch.Tensor, findings: Findings) -> None:
        """Rows cut to one fixed width: every row fills the batch (no padding anywhere) and some
        keep no label at all, their prompt (masked to -100) filling the width before the answer
        begins. Truncation at max_length from the right cut the answers away."""
        rows = len(labels)
        full = int(real[:, -1].sum())
        empty = int(((labels != IGNORE) & real).sum(dim=1).eq(0).sum())
        prompted = int((real & (labels == IGNORE))[:, 0].sum())
        findings.data["rows_without_labels"] = empty
        if rows < MIN_MASKED_ROWS or full < FULL_ROWS * rows or empty < max(2, EMPTY_ROWS * rows) \
                or prompted < FULL_ROWS * rows:
            return
        kept = (labels != IGNORE) & real
        findings.warning(
            "ANSWERS_TRUNCATED",
            f"every row of the batch fills its {labels.shape[1]} positions (no padding in {full} of {rows} rows) and "
            f"{empty} rows keep no label at all (on average {float(kept.sum(dim=1).float().mean()):.1f} label tokens "
            "a row): the sequences were truncated to max_length from the right, and the prompt (masked to -100) "
            "fills the width before the answer begins, so the answers and their end tokens are cut off and the "
            "model sees few of them",
            "Raise max_length to fit prompt and answer (check the longest tokenised example), shorten the system "
            "prompt, or truncate the prompt instead of the answer (truncation_side='left', or cut the prompt's "
            "tokens before appending the answer).",
            "data.train",
        )
