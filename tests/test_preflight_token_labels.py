"""TOKEN_LABELS_NOT_ALIGNED: word tags laid one per position on a word-piece sequence, where
they end long before the tokens; aligned tags (first piece, -100 elsewhere), one token per
word and prompt-completion labels stay quiet. A Hugging Face token classifier given its labels
in the batch is not read as ignoring positions (the labels reach only the loss)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.input_dependence import InputDependenceCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.checks.token_labels import TokenLabelsCheck, label_span
from tests.preflight_support import assert_quiet, codes

LENGTH = 40


def tagged_sentences(layout: str, samples: int = 64) -> list[dict[str, torch.Tensor]]:
    """Sentences of 5-10 words; word w splits into 1 + w % 3 pieces (``pieces=False``: one each).
    ``layout``: 'aligned' (first piece tagged), 'per_position' (the bug), 'one_piece' (no sub-words)
    or 'completion' (a prompt ignored, the rest trained, as a causal LM's fine-tuning)."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(samples):
        words = torch.randint(0, 30, (int(torch.randint(5, 11, (1,), generator=g)),), generator=g).tolist()
        pieces = {w: [4 + 3 * w + k for k in range(1 if layout == "one_piece" else 1 + w % 3)] for w in words}
        ids, labels = [1], [-100]
        for w in words:
            ids += pieces[w]
            labels += [w % 5] + [-100] * (len(pieces[w]) - 1)
        ids.append(2)
        labels.append(-100)
        if layout == "per_position":
            labels = [-100] + [w % 5 for w in words] + [-100] * (len(ids) - 1 - len(words))
        elif layout == "completion":
            labels = [-100] * (len(ids) // 2) + ids[len(ids) // 2:]
        pad = LENGTH - len(ids)
        rows.append({"input_ids": torch.tensor(ids + [0] * pad), "attention_mask": torch.tensor([1] * len(ids) + [0] * pad),
                     "labels": torch.tensor(labels + [-100] * pad)})
    return rows


@pytest.fixture
def transformers():
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    return transformers


def tagger(transformers):
    torch.manual_seed(0)
    return transformers.BertForTokenClassification(transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=LENGTH, num_labels=5))


def results(model, rows):
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                           DataLoader(rows, batch_size=16, shuffle=True),
                           checks=[FirstBatchCheck(), FirstStepCheck(), TokenLabelsCheck(), InputDependenceCheck()])
    return report.check("step.token_labels"), report.check("step.input_dependence")


def test_word_tags_laid_one_per_position_on_word_pieces_fire(transformers):
    labels, dependence = results(tagger(transformers), tagged_sentences("per_position"))
    assert codes(labels) == {"TOKEN_LABELS_NOT_ALIGNED"}
    assert "word_ids()" in labels.issues[0].fix and "-100" in labels.issues[0].fix
    assert labels.data["short_rows"] >= 0.75 * labels.data["rows"]
    assert_quiet(dependence)


@pytest.mark.parametrize("layout", ["aligned", "one_piece"])
def test_aligned_tags_and_one_token_per_word_are_quiet(transformers, layout):
    labels, dependence = results(tagger(transformers), tagged_sentences(layout))
    assert_quiet(labels)
    assert_quiet(dependence)  # the labels in the batch reach the loss only: no position is "ignored"


def test_prompt_completion_labels_end_at_the_last_token():
    rows = tagged_sentences("completion", 16)
    stacked = {key: torch.stack([row[key] for row in rows]) for key in rows[0]}
    span = label_span(stacked["input_ids"], stacked["attention_mask"], stacked["labels"])
    assert span is not None and span.short == 0 and span.rows == 16


class GruTagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.rnn, self.out = torch.nn.Embedding(100, 16), torch.nn.GRU(16, 16, batch_first=True), \
            torch.nn.Linear(16, 5)

    def forward(self, ids):
        return self.out(self.rnn(self.embed(ids))[0])


@pytest.mark.parametrize("layout", ["per_position", "aligned"])
def test_an_ids_labels_tuple_is_read_too(layout):
    rows = tagged_sentences(layout)
    pairs = DataLoader([(row["input_ids"], row["labels"]) for row in rows], batch_size=16, shuffle=True)
    model = GruTagger()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), pairs,
                           loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]).reshape(-1, 5),
                                                                                 b[1].reshape(-1)),
                           checks=[FirstBatchCheck(), TokenLabelsCheck()])
    result = report.check("step.token_labels")
    assert codes(result) == ({"TOKEN_LABELS_NOT_ALIGNED"} if layout == "per_position" else set())


def test_labels_that_are_token_ids_are_another_task():
    from optimus_preflight.preflight.checks.token_labels import ids_mask_labels

    rows = tagged_sentences("aligned", 8)
    ids = torch.stack([row["input_ids"] for row in rows])
    target = torch.full_like(ids, -100)
    target[:, :5] = ids[:, 1:6]  # a seq2seq target of token ids, shorter than the source
    assert ids_mask_labels({"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": target}) is None


def _offset_rows(shifted: bool, samples: int = 256) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Short sentences (one token per word, so nothing ends early) whose tags sit on their own
    tokens, or one position to the left (written from position 0, over [CLS]); padded per batch."""
    rows = tagged_sentences("one_piece", samples)
    out = []
    for row in rows:
        labels = row["labels"].clone()
        if shifted:
            labels = torch.cat([labels[1:], torch.tensor([-100])])
        out.append((row["input_ids"], labels))
    return out


@pytest.mark.parametrize("shifted", [True, False], ids=["tags_one_to_the_left", "tags_in_place"])
def test_a_tag_offset_is_read_past_a_first_batch_too_small_to_tell(shifted):
    """16 sentences of 5-10 words hold under 512 tags: the check reads on through the loader."""
    model = GruTagger()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(_offset_rows(shifted), batch_size=16, shuffle=True),
                           loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]).reshape(-1, 5),
                                                                                 b[1].reshape(-1)),
                           checks=[FirstBatchCheck(), TokenLabelsCheck()])
    result = report.check("step.token_labels")
    assert codes(result) == ({"TOKEN_LABELS_NOT_ALIGNED"} if shifted else set())
    if shifted:
        assert "1 position(s) after" in result.issues[0].message
