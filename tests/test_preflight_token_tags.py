"""data.split_labels, VAL_LABEL_MAPPING for per-token tags: a tagger whose label2id was built per
split (tags numbered in the order each split meets them) fires; one shared mapping, a
validation set on other words, and -100 on ignored positions stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.token_tags import ids_and_tags, tag_renumbering
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.split_labels import SplitLabelsCheck

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def sentences(count: int, seed: int, words: range = range(1, 200)):
    """Each word id has its own tag (its id modulo the tag count); 10% of positions ignored."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor(list(words))[torch.randint(0, len(words), (count, 12), generator=g)]
    names = [[TAGS[int(w) % len(TAGS)] for w in row] for row in ids]
    ignored = torch.rand(count, 12, generator=g) < 0.1
    return ids, names, ignored


def encode(names, ignored, label2id):
    tags = torch.tensor([[label2id[name] for name in row] for row in names])
    return tags.masked_fill(ignored, -100)


def in_order_met(names):
    mapping: dict[str, int] = {}
    for row in names:
        for name in row:
            mapping.setdefault(name, len(mapping))
    return mapping


def report(per_split: bool, val_words: range = range(1, 200)):
    train_ids, train_names, train_ignored = sentences(800, 0)
    val_ids, val_names, val_ignored = sentences(300, 1, val_words)
    train_map = in_order_met(train_names)
    val_map = in_order_met(val_names[::-1]) if per_split else train_map
    model = torch.nn.Sequential(torch.nn.Embedding(200, 16), torch.nn.Linear(16, len(TAGS)))
    return run_preflight(
        model, torch.optim.Adam(model.parameters(), 1e-3),
        DataLoader(TensorDataset(train_ids, encode(train_names, train_ignored, train_map)), batch_size=32, shuffle=True),
        val_loader=DataLoader(TensorDataset(val_ids, encode(val_names, val_ignored, val_map)), batch_size=64),
        loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]).flatten(0, 1), b[1].flatten(), ignore_index=-100),
        checks=[FirstBatchCheck(), SplitLabelsCheck()]).check("data.split_labels")


@pytest.mark.parametrize("per_split", [True, False])
def test_tags_numbered_per_split_fire_and_one_mapping_is_quiet(per_split):
    found = [issue for issue in report(per_split).issues if issue.code == "VAL_LABEL_MAPPING"]
    assert bool(found) == per_split
    if found:
        assert "the validation tags use other ids than the training tags" in found[0].message
        assert "label2id" in found[0].message and "encode every split with that same mapping" in found[0].fix


def test_validation_on_words_training_never_saw_is_no_renumbering():
    result = report(True, val_words=range(200, 300))
    assert result.data["summary"] == "too few tagged tokens to compare" and not result.issues


def test_the_pure_comparison_reads_a_renumbering():
    train_ids, train_names, ignored = sentences(400, 0)
    val_ids, val_names, val_ignored = sentences(200, 1)
    mapping = {name: index for index, name in enumerate(TAGS)}
    swapped = {**mapping, "O": 1, "B-PER": 0}
    held, val, renumbered, moved, _ = tag_renumbering(train_ids, encode(train_names, ignored, mapping), val_ids,
                                                      encode(val_names, val_ignored, swapped))
    assert held == 1.0 and val < 0.7 and renumbered == 1.0 and moved[0] == 1 and moved[1] == 0
    assert ids_and_tags((train_ids.float(), train_ids)) is None
    tags = encode(train_names, ignored, mapping)
    assert ids_and_tags({"input_ids": train_ids, "labels": tags})[0].shape == (400, 12)
    assert ids_and_tags({"input_ids": train_ids, "labels": train_ids}) is None  # token ids as labels: an LM's


def slot_batches(shifted: bool, language_model: bool = False):
    """[CLS] w1..w10 [SEP]; each word's tag a function of the word; -100 on [CLS]/[SEP]."""
    g = torch.Generator().manual_seed(3)
    words = torch.randint(3, 63, (640, 10), generator=g)
    ids = torch.cat([torch.full((640, 1), 1), words, torch.full((640, 1), 2)], 1)
    if language_model:
        return ids[:, :-1], ids[:, 1:]
    labels = torch.full_like(ids, -100)
    if shifted:
        labels[:, :10] = (words * 7 + 3) % 5  # written from position 0, over [CLS]
    else:
        labels[:, 1:11] = (words * 7 + 3) % 5
    return ids, labels


@pytest.mark.parametrize("shifted,language_model", [(True, False), (False, False), (False, True)],
                         ids=["tags_over_cls", "aligned", "next_token_targets"])
def test_tags_written_one_position_early_are_named(shifted, language_model):
    from optimus_preflight.preflight.checks.token_labels import TokenLabelsCheck

    ids, labels = slot_batches(shifted, language_model)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64 if language_model else 5))
    result = run_preflight(
        model, torch.optim.Adam(model.parameters(), 1e-3),
        DataLoader(TensorDataset(ids, labels), batch_size=320, shuffle=True),
        loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]).flatten(0, 1), b[1].flatten()),
        checks=[FirstBatchCheck(), TokenLabelsCheck()]).check("step.token_labels")
    assert [issue.code for issue in result.issues] == (["TOKEN_LABELS_NOT_ALIGNED"] if shifted else [])
    if shifted:
        assert "told by the token 1 position(s) after it" in result.issues[0].message
        assert "over [CLS]" in result.issues[0].message and "labels[1:n + 1] = tags" in result.issues[0].fix


def test_worker_loaders_read_to_their_end_are_closed_without_a_crash():
    # The validation loader holds fewer samples than the check reads: its iterator is exhausted,
    # and torch has already shut its worker down when the guard closes it.
    train_ids, train_names, train_ignored = sentences(800, 0)
    val_ids, val_names, val_ignored = sentences(300, 1)
    mapping = in_order_met(train_names)
    model = torch.nn.Sequential(torch.nn.Embedding(200, 16), torch.nn.Linear(16, len(TAGS)))
    result = run_preflight(
        model, torch.optim.Adam(model.parameters(), 1e-3),
        DataLoader(TensorDataset(train_ids, encode(train_names, train_ignored, mapping)), batch_size=32, num_workers=1),
        val_loader=DataLoader(TensorDataset(val_ids, encode(val_names, val_ignored, in_order_met(val_names[::-1]))),
                              batch_size=64, num_workers=1),
        loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]).flatten(0, 1), b[1].flatten(), ignore_index=-100),
        checks=[FirstBatchCheck(), SplitLabelsCheck()]).check("data.split_labels")
    assert result.status.value == "warning" and [issue.code for issue in result.issues] == ["VAL_LABEL_MAPPING"]
