"""Labels masked by the pad id where the pad id is also a real token (``data.label_masking``).

``tokenizer.pad_token = tokenizer.eos_token`` is the usual recipe for GPT-2 style models.
Masking the labels with ``labels[input_ids == pad_token_id] = -100`` then removes every
real EOS from the targets too, not only the padding: the model is never trained to end a
sequence, and generation never stops. Masking by ``attention_mask == 0`` keeps them.

Read from a Hugging Face style batch: attended positions (``attention_mask == 1``) whose
label is ignored, every one of them holding the id that fills the padding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.checks.batch_checks import is_map_style
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.data_access.samples import ordered_loader
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

IGNORE = -100
MIN_ROWS_HIT = 0.5  # of the rows that have padding: each loses its real end token


MIN_PAIRED_ROWS = 16  # rows with a prompt and an answer before their pairing is read
NEXT_ROW_GAP = 0.2  # answers share this much more of the next row's prompt than of their own: pairs one row off
ORDERED_ROWS = 64  # training rows read in dataset order
FULL_ROWS = 0.9  # of the rows: no padding, every row as wide as the batch, each starting with a masked prompt
EMPTY_ROWS = 0.1  # of the rows keep no label at all
MIN_MASKED_ROWS = 8  # rows with both supervised and ignored real tokens before the layout is read
PROMPT_ONLY_SHARE = 0.8  # of those rows: the labels keep the start and drop the end


def ids_and_labels(batch: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(input ids, labels, real positions) of a token batch: a mapping's input_ids / labels /
    attention_mask, or an ``(ids, labels)`` pair of one (B, T) integer shape whose padding is
    the trailing run of the id that ends the shorter rows."""
    if isinstance(batch, Mapping):
        ids, labels, mask = batch.get("input_ids"), batch.get("labels"), batch.get("attention_mask")
    elif isinstance(batch, (list, tuple)) and len(batch) == 2:
        (ids, labels), mask = batch, None
    else:
        return None
    if not (isinstance(ids, torch.Tensor) and isinstance(labels, torch.Tensor)) or ids.dim() != 2 \
            or ids.shape != labels.shape or ids.is_floating_point() or labels.is_floating_point():
        return None
    if isinstance(mask, torch.Tensor) and mask.shape == ids.shape:
        return ids, labels, mask != 0
    pad_id = int(torch.mode(ids[:, -1]).values)
    trailing = (ids == pad_id).flip(1).long().cumprod(dim=1).flip(1).bool()
    return ids, labels, ~trailing


def copies_the_ids(ids: torch.Tensor, labels: torch.Tensor) -> bool:
    """Whether the kept labels are the input ids themselves, or the ids one position on (a
    causal LM's targets): 95% of them (pure)."""
    kept = labels != IGNORE
    if not bool(kept.any()):
        return False
    same = float((labels[kept] == ids[kept]).float().mean())
    ahead = kept[:, :-1]
    next_ids = float((labels[:, :-1][ahead] == ids[:, 1:][ahead]).float().mean()) if bool(ahead.any()) else 0.0
    return max(same, next_ids) >= 0.95


MAX_OFFSET_WIDTH = 256  # positions per row searched for the labels' offset
MIN_OFFSET_ROWS = 8


def row_offsets(ids: torch.Tensor, labels: torch.Tensor) -> list[int | None]:
    """Per row, the shift o with labels[t] == ids[t - o] at every kept position (pure): 0 for
    labels that are the ids, -1 for labels that are the next ids; None where no shift fits."""
    offsets: list[int | None] = []
    width = ids.shape[1]
    for row_ids, row_labels in zip(ids, labels, strict=True):
        kept = torch.nonzero(row_labels != IGNORE).flatten()
        if len(kept) < 2:
            offsets.append(None)
            continue
        found = None
        for shift in sorted(range(-width + 1, width), key=abs):
            source = kept - shift
            if bool(((source >= 0) & (source < width)).all()) and torch.equal(row_ids[source], row_labels[kept]):
                found = shift
                break
        offsets.append(found)
    return offsets


def pairing_overlap(ids: torch.Tensor, labels: torch.Tensor, real: torch.Tensor) -> tuple[float, float] | None:
    """(share of each row's answer tokens found in its own prompt, the same against the next row's
    prompt) of a token batch (pure). The prompt is what the labels ignore of a row that copies its
    ids (an instruction masked to -100), or the whole input of an encoder-decoder row; the answer is
    what the labels keep. None with fewer than MIN_PAIRED_ROWS rows holding both."""
    copies = copies_the_ids(ids, labels)
    prompts, answers = [], []
    for row_ids, row_labels, row_real in zip(ids, labels, real, strict=True):
        kept = row_labels != IGNORE
        where = torch.nonzero(kept).flatten()
        if len(where) and int(where[-1] - where[0]) + 1 != len(where):
            return None  # labels scattered over the row (a masked LM's masked tokens): no answer to pair
        prompt = row_ids[row_real & ~kept] if copies else row_ids[row_real]
        answer = row_labels[kept]
        if len(prompt) and len(answer):
            prompts.append(set(prompt.tolist()))
            answers.append(set(answer.tolist()))
    if len(prompts) < MIN_PAIRED_ROWS:
        return None

    def share(prompt: set, answer: set) -> float:
        return len(prompt & answer) / len(answer)

    rows = len(prompts)
    own = sum(share(prompts[i], answers[i]) for i in range(rows)) / rows
    other = sum(share(prompts[(i + 1) % rows], answers[i]) for i in range(rows)) / rows
    return own, other


def prompt_only_rows(labels: torch.Tensor, real: torch.Tensor) -> tuple[int, int]:
    """(rows whose labels keep a start of the real tokens and ignore the rest, two tokens or
    more; rows with both kept and ignored real tokens) (pure)."""
    kept = (labels != IGNORE) & real
    dropped = (labels == IGNORE) & real
    mixed = kept.any(dim=1) & dropped.any(dim=1)
    positions = torch.arange(labels.shape[1]).expand_as(labels)
    last_kept = torch.where(kept, positions, -1).amax(dim=1)
    first_dropped = torch.where(dropped, positions, labels.shape[1]).amin(dim=1)
    last_real = torch.where(real, positions, -1).amax(dim=1)
    head_only = mixed & (last_kept < first_dropped) & (dropped.sum(dim=1) >= 2) \
        & (dropped.sum(dim=1) == last_real - first_dropped + 1)
    return int(head_only.sum()), int(mixed.sum())


class LabelMaskingCheck(Check):
    """LABELS_MASK_REAL_TOKEN: the pad id is a real token the label mask removes.
    LABELS_ONLY_ON_PROMPT: the labels keep each sequence's start and ignore its end."""

    name = "data.label_masking"
    stage = Stage.DATA
    codes = ("LABELS_MASK_REAL_TOKEN", "LABELS_ONLY_ON_PROMPT", "LABELS_PADDED_APART", "ANSWERS_ONE_ROW_OFF",
             "ANSWERS_TRUNCATED")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = ctx.artifacts.first_batch
        self._prompt_only(batch, findings)
        if ids_and_labels(batch) is not None:
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
