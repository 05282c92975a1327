"""data.collate_context: a collate_fn whose output for a sample depends on the other samples
of its batch (COLLATE_DEPENDS_ON_BATCH): categories encoded per batch, features standardised
per batch. Collates that work sample by sample stay quiet whatever they pad, sort or draw."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.collate_context import CollateContextCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck

REGIONS = ["north", "south", "east", "west", "coast", "delta", "metro", "plain"]
VOCAB = {name: k for k, name in enumerate(REGIONS)}


class Policies(Dataset):
    def __init__(self, n: int = 400):
        g = torch.Generator().manual_seed(0)
        self.rows = [{"region": REGIONS[int(torch.randint(0, 8, (1,), generator=g))], "num": torch.randn(4, generator=g),
                      "label": int(torch.randint(0, 2, (1,), generator=g)),
                      "tokens": torch.randint(1, 40, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g)}
                     for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]


def per_batch_vocab(rows):
    vocab = {c: k for k, c in enumerate(sorted({r["region"] for r in rows}))}
    return (torch.tensor([vocab[r["region"]] for r in rows]), torch.stack([r["num"] for r in rows])), \
        torch.tensor([r["label"] for r in rows])


def global_vocab(rows):
    return (torch.tensor([VOCAB[r["region"]] for r in rows]), torch.stack([r["num"] for r in rows])), \
        torch.tensor([r["label"] for r in rows])


def per_batch_standardised(rows):
    (region, num), label = global_vocab(rows)
    return (region, (num - num.mean(0)) / (num.std(0) + 1e-6)), label


def padded(rows, *, left: bool = False):
    tokens = [r["tokens"].flip(0) if left else r["tokens"] for r in rows]
    ids = pad_sequence(tokens, batch_first=True)
    mask = ids != 0
    if left:
        ids, mask = ids.flip(1), mask.flip(1)
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([r["label"] for r in rows])}


def sorted_by_length(rows):
    rows = sorted(rows, key=lambda r: len(r["tokens"]), reverse=True)
    return padded(rows), torch.tensor([len(r["tokens"]) for r in rows])


def random_masking(rows):
    batch = padded(rows)
    masked = (torch.rand(batch["input_ids"].shape) < 0.15) & batch["attention_mask"]
    batch["labels"] = torch.where(masked, batch["input_ids"], -100)
    batch["input_ids"] = batch["input_ids"].masked_fill(masked, 1)
    return batch


def in_batch_labels(rows):
    batch = padded(rows)
    batch["labels"] = torch.arange(len(rows))  # contrastive: the i-th positive sits in row i
    return batch


def packed(rows):
    lengths = torch.tensor([len(r["tokens"]) for r in rows])
    return pack_padded_sequence(pad_sequence([r["tokens"] for r in rows], batch_first=True), lengths,
                                batch_first=True, enforce_sorted=False), torch.tensor([r["label"] for r in rows])


class Tabular(nn.Module):
    def __init__(self):
        super().__init__()
        self.region, self.head = nn.Embedding(8, 4), nn.Linear(8, 2)

    def forward(self, inputs):
        region, num = inputs
        return self.head(torch.cat([self.region(region), num], -1))


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(40, 8), nn.Linear(8, 2)

    def forward(self, batch):
        ids = batch["input_ids"] if isinstance(batch, dict) else batch
        return self.head(self.embed(ids).mean(1))


def _codes(collate, model, loss_fn):
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(Policies(), batch_size=16, shuffle=True, collate_fn=collate), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), CollateContextCheck()])
    return report.check("data.collate_context").issues


def _tabular_loss(model, batch):
    inputs, label = batch
    return nn.functional.cross_entropy(model(inputs), label)


@pytest.mark.parametrize("collate,blamed", [(per_batch_vocab, "batch[0][0]"), (per_batch_standardised, "batch[0][1]"),
                                            (global_vocab, None)])
def test_a_collate_that_encodes_each_sample_by_its_batch(collate, blamed):
    issues = _codes(collate, Tabular(), _tabular_loss)
    assert [i.code for i in issues] == (["COLLATE_DEPENDS_ON_BATCH"] if blamed else [])
    if blamed:
        assert f"disagree in {blamed} for" in issues[0].message and "each batch" in issues[0].message
        assert "once, from the training set" in issues[0].fix


def _token_loss(model, batch):
    batch = batch[0] if isinstance(batch, tuple) else batch
    return model(batch).logsumexp(-1).mean()


@pytest.mark.parametrize("collate", [padded, lambda rows: padded(rows, left=True), sorted_by_length, random_masking,
                                     in_batch_labels],
                         ids=["right_padding", "left_padding", "sorted_by_length", "random_masking", "in_batch_labels"])
def test_collates_that_work_sample_by_sample_stay_quiet(collate):
    assert _codes(collate, Tokens(), _token_loss) == []


def test_a_packed_sequence_collate_stays_quiet():
    class Packed(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.rnn, self.head = nn.Embedding(40, 8), nn.GRU(8, 8, batch_first=True), nn.Linear(8, 2)

        def forward(self, packed_ids):
            _, hidden = self.rnn(packed_ids._replace(data=self.embed(packed_ids.data)))
            return self.head(hidden[-1])

    assert _codes(packed, Packed(), lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1])) == []


def test_a_collate_that_reorders_only_the_inputs_is_left_to_data_collate_order():
    def sorted_inputs_only(rows):
        labels = torch.tensor([r["label"] for r in rows])
        return sorted_by_length(rows)[0]["input_ids"], labels  # the labels keep the order the samples came in

    assert _codes(sorted_inputs_only, Tokens(), lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1])) == []


def test_a_deterministic_mixup_collate_with_soft_targets_stays_quiet():
    def mixup(rows):
        (region, num), label = global_vocab(rows)
        flip = torch.arange(len(rows)).flip(0)
        soft = nn.functional.one_hot(label, 2).float()
        return (region, 0.7 * num + 0.3 * num[flip]), 0.7 * soft + 0.3 * soft[flip]

    assert _codes(mixup, Tabular(), lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1])) == []
