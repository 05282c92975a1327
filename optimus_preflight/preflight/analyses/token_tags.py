"""Per-token tags whose ids mean other tags in validation than in training (pure).

A tagger's label2id built separately per split (ids in order of first appearance, a
``LabelEncoder`` fitted on each split) numbers the same tags differently as soon as the
splits meet them in another order. The token ids say which: a word's tag is mostly the same
wherever it occurs, so the tag a training word usually carries predicts its tag in
validation. When validation tags agree with that prediction far less often than held-out
training tags do, and reading each validation id as another id restores the agreement, the
validation ids are a renumbering of the training ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

MIN_POSITIONS = 256  # tagged positions per split before a comparison means anything
MIN_TAG_POSITIONS = 5  # validation positions of a tag before its renumbering counts
MAX_TAGS = 100
TOKEN_KEYS = ("input_ids", "tokens", "token_ids", "words", "word_ids")
TAG_KEYS = ("labels", "tags", "tag_ids", "ner_tags", "label_ids")


def ids_and_tags(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(token ids, tags), both integer (B, T), of an ``(ids, tags)`` batch or a mapping's keys."""
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        ids, tags = batch
    elif isinstance(batch, Mapping):
        ids = next((batch[key] for key in TOKEN_KEYS if key in batch), None)
        tags = next((batch[key] for key in TAG_KEYS if key in batch), None)
    else:
        return None
    if not (isinstance(ids, torch.Tensor) and isinstance(tags, torch.Tensor)) or ids.dim() != 2 \
            or ids.shape != tags.shape or ids.is_floating_point() or tags.is_floating_point() \
            or ids.dtype == torch.bool or tags.dtype == torch.bool or not ids.numel():
        return None
    ids, tags = ids.detach().long().cpu(), tags.detach().long().cpu()
    tagged = tags[tags >= 0]
    # Tags are a handful of class ids; labels in the token ids' own range are tokens (an LM's next
    # token, a seq2seq target).
    if not tagged.numel() or int(tagged.max()) >= MAX_TAGS or int(tagged.max()) * 2 > int(ids.max()):
        return None
    return ids, tags


def _positions(ids: torch.Tensor, tags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    kept = tags >= 0  # -100 (ignore_index) and other negative fills carry no tag
    return ids[kept], tags[kept]


def _table(ids: torch.Tensor, tags: torch.Tensor, vocabulary: int, classes: int) -> torch.Tensor:
    table = torch.zeros(vocabulary, classes)
    table.index_put_((ids, tags), torch.ones(len(ids)), accumulate=True)
    return table


def _predict(table: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The usual tag of each token id, and which ids the table has seen at all."""
    counts = table[ids]
    return counts.argmax(1), counts.sum(1) > 0


def tag_renumbering(train_ids: torch.Tensor, train_tags: torch.Tensor, val_ids: torch.Tensor,
                    val_tags: torch.Tensor) -> tuple[float, float, float, dict[int, int], float] | None:
    """(held-out training agreement, validation agreement, validation agreement with each
    validation id read as its best training id, that mapping, the largest tag's share)."""
    half = len(train_ids) // 2
    fit_ids, fit_tags = _positions(train_ids[:half], train_tags[:half])
    held_ids, held_tags = _positions(train_ids[half:], train_tags[half:])
    all_ids, all_tags = _positions(train_ids, train_tags)
    check_ids, check_tags = _positions(val_ids, val_tags)
    if min(len(held_ids), len(check_ids)) < MIN_POSITIONS:
        return None
    classes = int(max(int(all_tags.max()), int(check_tags.max()))) + 1
    vocabulary = int(max(int(all_ids.max()), int(check_ids.max()))) + 1
    if classes > MAX_TAGS or classes < 2:
        return None
    held_pred, held_seen = _predict(_table(fit_ids, fit_tags, vocabulary, classes), held_ids)
    val_pred, val_seen = _predict(_table(all_ids, all_tags, vocabulary, classes), check_ids)
    if int(held_seen.sum()) < MIN_POSITIONS or int(val_seen.sum()) < MIN_POSITIONS:
        return None
    train_agreement = float((held_pred[held_seen] == held_tags[held_seen]).float().mean())
    predicted, actual = val_pred[val_seen], check_tags[val_seen]
    val_agreement = float((predicted == actual).float().mean())
    mapping, agreeing = {}, 0
    for tag in torch.unique(actual).tolist():
        picked = predicted[actual == tag]
        best = torch.mode(picked).values
        agreeing += int((picked == best).sum())
        if len(picked) >= MIN_TAG_POSITIONS:
            mapping[int(tag)] = int(best)
    majority = float(torch.bincount(all_tags).max()) / len(all_tags)
    return train_agreement, val_agreement, agreeing / len(actual), mapping, majority


OFFSETS = (-2, -1, 1, 2)
OFFSET_GAIN = 0.3  # agreement at the offset above the agreement in place
ABOVE_MAJORITY = 0.2  # ... and above always answering the commonest tag


def tag_offset(ids: torch.Tensor, tags: torch.Tensor) -> tuple[int, float, float, float] | None:
    """(k, agreement at k, agreement in place, the commonest tag's share) when the tag at
    position i is told by the token at i + k far better than by the token at i: tags written
    k positions off their tokens (from position 0 over [CLS], k=1). Agreement is of each
    held-out row's tags with the usual tag of the token they are read against."""
    half = len(ids) // 2
    if half < 2:
        return None
    tagged = tags[tags >= 0]
    if tagged.numel() < MIN_POSITIONS:
        return None
    classes, vocabulary = int(tagged.max()) + 1, int(ids.max()) + 1
    majority = float(torch.bincount(tagged).max()) / tagged.numel()

    def agreement(offset: int) -> float | None:
        length = ids.shape[1]
        start, stop = max(0, -offset), min(length, length - offset)
        read, told = ids[:, start + offset:stop + offset], tags[:, start:stop]
        fit_ids, fit_tags = _positions(read[:half], told[:half])
        held_ids, held_tags = _positions(read[half:], told[half:])
        if not len(fit_ids) or not len(held_ids):
            return None
        predicted, seen = _predict(_table(fit_ids, fit_tags, vocabulary, classes), held_ids)
        if int(seen.sum()) < MIN_POSITIONS // 2:
            return None
        return float((predicted[seen] == held_tags[seen]).float().mean())

    in_place = agreement(0)
    if in_place is None:
        return None
    scored = [(found, offset) for offset in OFFSETS if (found := agreement(offset)) is not None]
    if not scored:
        return None
    best, offset = max(scored)
    if best >= in_place + OFFSET_GAIN and best >= majority + ABOVE_MAJORITY:
        return offset, best, in_place, majority
    return None
