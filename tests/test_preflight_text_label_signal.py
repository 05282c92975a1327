"""data.split_labels on text: LABELS_UNRELATED from hashed token counts, given for two review
exports merged with opposite label codings (a warning for this bag-of-words model; a note for
models that read word order, which counts cannot see); nothing on the same texts with one coding."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.split_labels import SplitLabelsCheck, token_bags


def reviews(n: int, opposite_coding_in_half: bool) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    positive_words, negative_words = torch.arange(2, 12), torch.arange(12, 22)
    sentiment = torch.randint(0, 2, (n,), generator=g)
    ids = torch.randint(22, 200, (n, 20), generator=g)
    for _ in range(3):
        word = torch.where(sentiment == 1, positive_words[torch.randint(0, 10, (n,), generator=g)],
                           negative_words[torch.randint(0, 10, (n,), generator=g)])
        ids[torch.arange(n), torch.randint(0, 20, (n,), generator=g)] = word
    second_export = torch.arange(n) % 2 == 1  # its label is 'is_complaint': 1 = negative
    labels = torch.where(second_export & opposite_coding_in_half, 1 - sentiment, sentiment)
    return TensorDataset(ids, labels)


@pytest.mark.parametrize("opposite, fires", [(True, True), (False, False)], ids=["merged_codings", "one_coding"])
def test_labels_unrelated_to_the_words_fire_on_text(opposite, fires):
    model = nn.Sequential(nn.EmbeddingBag(200, 16), nn.Linear(16, 2))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(reviews(2048, opposite), batch_size=64, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), SplitLabelsCheck()])
    issues = [i for i in report.check("data.split_labels").issues if i.code == "LABELS_UNRELATED"]
    assert bool(issues) == fires
    if fires:  # an EmbeddingBag reads no order either: a warning, not the note order-aware models get
        assert issues[0].severity.value == "warning" and "reads them as a bag" in issues[0].message
        assert "hashed token counts" in issues[0].message and "two sources" in issues[0].message


def test_token_bags_count_each_row_once_and_ignore_floats_and_few_ids():
    ids = torch.tensor([[3, 3, 5, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 8]])
    bags = token_bags((ids, torch.tensor([0, 1])))
    assert bags.shape == (2, 256) and torch.allclose(bags.sum(1), torch.ones(2)) and bags[0, 3] == 0.25
    assert token_bags((ids.float(), torch.tensor([0, 1]))) is None
    assert token_bags((ids[:, :2], torch.tensor([0, 1]))) is None
