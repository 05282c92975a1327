"""step.padding_invariance: predictions that move when a batch gets more padding
(PADDING_CHANGES_OUTPUT): attention masking the padded queries instead of the keys, a mean
EmbeddingBag without padding_idx, a mean over every position; masked keys, padding_idx, a
packed LSTM, a max-pooled CNN and a Hugging Face encoder given its attention_mask stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.padding_invariance import PaddingInvarianceCheck, widened
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from tests.preflight_support import assert_quiet

NAME = "step.padding_invariance"


def padded_ids(rows: int = 256, width: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(rows, width, dtype=torch.long)
    for row, length in enumerate(torch.randint(4, width, (rows,), generator=g).tolist()):
        ids[row, :length] = torch.randint(1, 30, (length,), generator=g)
    return ids, (ids[:, 0] > 15).long()


class Attention(nn.Module):
    def __init__(self, mask_keys: bool):
        super().__init__()
        torch.manual_seed(0)
        self.mask_keys = mask_keys
        self.embed, self.query, self.key, self.head = nn.Embedding(30, 32), nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 2)

    def forward(self, ids):
        h, pad = self.embed(ids), ids == 0
        scores = self.query(h) @ self.key(h).transpose(1, 2) / 32 ** 0.5
        scores = scores.masked_fill(pad[:, None, :] if self.mask_keys else pad[:, :, None], -1e9)
        return self.head((scores.softmax(-1) @ h)[:, 0])


class MeanOfEmbeddings(nn.Module):
    def __init__(self, masked: bool):
        super().__init__()
        torch.manual_seed(0)
        self.masked, self.embed, self.head = masked, nn.Embedding(30, 32, padding_idx=0), nn.Linear(32, 2)

    def forward(self, ids):
        keep = (ids != 0).float()[..., None] if self.masked else torch.ones(*ids.shape, 1)
        return self.head((self.embed(ids) * keep).sum(1) / keep.sum(1))


class PackedLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.lstm, self.head = nn.Embedding(30, 16, padding_idx=0), nn.LSTM(16, 32, batch_first=True), nn.Linear(32, 2)

    def forward(self, ids):
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(ids), (ids != 0).sum(1).cpu(), batch_first=True,
                                                   enforce_sorted=False)
        return self.head(self.lstm(packed)[1][0][-1])


class MaxPooledCNN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.conv, self.head = nn.Embedding(30, 32, padding_idx=0), nn.Conv1d(32, 32, 3, padding=1), nn.Linear(32, 2)

    def forward(self, ids):
        return self.head(torch.relu(self.conv(self.embed(ids).transpose(1, 2))).amax(2))


def run(model: nn.Module):
    ids, labels = padded_ids()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids, labels), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), PaddingInvarianceCheck()])
    return report.check(NAME)


@pytest.mark.parametrize("model", [lambda: Attention(mask_keys=False), lambda: MeanOfEmbeddings(masked=False),
                                   lambda: nn.Sequential(nn.EmbeddingBag(30, 32, mode="mean"), nn.Linear(32, 2))],
                         ids=["queries_masked", "mean_over_padding", "bag_without_padding_idx"])
def test_padding_that_reaches_the_prediction_fires(model):
    result = run(model())
    issues = [i for i in result.issues if i.code == "PADDING_CHANGES_OUTPUT"]
    assert issues, result.data
    assert "pad[:, None, :]" in issues[0].fix and "padding_idx=pad_id" in issues[0].fix


@pytest.mark.parametrize("model", [lambda: Attention(mask_keys=True), lambda: MeanOfEmbeddings(masked=True),
                                   lambda: nn.Sequential(nn.EmbeddingBag(30, 32, mode="mean", padding_idx=0), nn.Linear(32, 2)),
                                   PackedLSTM, MaxPooledCNN],
                         ids=["keys_masked", "masked_mean", "bag_padding_idx", "packed_lstm", "max_pooled_cnn"])
def test_models_that_ignore_the_padding_stay_quiet(model):
    result = run(model())
    assert_quiet(result)
    assert result.data["median_change"] < 1e-3


def test_a_hugging_face_encoder_given_its_mask_stays_quiet():
    transformers = pytest.importorskip("transformers")
    ids, labels = padded_ids(128)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=30, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=2,
        pad_token_id=0))
    rows = [{"input_ids": ids[i], "attention_mask": (ids[i] != 0).long(), "labels": labels[i]} for i in range(len(ids))]
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3), DataLoader(rows, batch_size=16),
                           checks=[FirstBatchCheck(), FirstStepCheck(), PaddingInvarianceCheck()])
    result = report.check(NAME)
    assert_quiet(result)
    assert result.data["median_change"] < 1e-3


def test_token_labels_beside_the_ids_get_no_guessed_fill():
    ids, _ = padded_ids(8)
    assert widened((ids, ids.clone()), 0, ids, 0, 4) is None
    grown = widened({"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": ids.clone()}, "input_ids", ids, 0, 4)
    assert grown["input_ids"].shape == (8, 20) and bool((grown["attention_mask"][:, -4:] == 0).all())
    assert bool((grown["labels"][:, -4:] == -100).all())
