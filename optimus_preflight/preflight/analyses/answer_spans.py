"""Where the answer sits in a token batch's labels, read without the model (pure functions).

Instruction tuning and seq2seq batches hold ``input_ids``, ``labels`` (``-100`` where the loss
ignores a position) and an attention mask, or an ``(ids, labels)`` pair padded at the end. These
read which positions are real, whether the kept labels copy the ids (a causal LM's targets, the
model shifting or not), each row's offset between its labels and its own tokens, the rows whose
labels keep the start and drop the end, and how much of each answer its own prompt holds against
the next row's: the facts ``data.label_masking`` judges.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

IGNORE = -100

MIN_PAIRED_ROWS = 16  # rows with a prompt and an answer before their pairing is read


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
    return ids, labels, before_trailing_padding(ids)


def before_trailing_padding(ids: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the positions of right-padded ids before each row's trailing run of the pad id,
    the id that ends most rows (pure)."""
    pad_id = int(torch.mode(ids[:, -1]).values)
    return ~(ids == pad_id).flip(1).long().cumprod(dim=1).flip(1).bool()


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
