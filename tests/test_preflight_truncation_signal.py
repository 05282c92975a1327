"""data.truncation_signal: a fixed-length truncation that keeps the start of texts whose label
sits at their end (TRUNCATION_DROPS_SIGNAL), from an (ids, label) collate and a Hugging Face-style
dict collate; keeping the end, signal spread over the whole text, and untruncated padding stay
quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.truncation_signal import TruncationSignalCheck, kept_end
from tests.preflight_support import assert_quiet

NAME = "data.truncation_signal"


class Tickets(Dataset):
    """64-token texts; the label is written by two marker tokens at ``where`` ("end": in the last
    16 positions, "spread": anywhere)."""

    def __init__(self, where: str, rows: int = 900):
        g = torch.Generator().manual_seed(3)
        self.items = []
        for _ in range(rows):
            label = int(torch.randint(0, 3, (1,), generator=g))
            ids = torch.randint(10, 200, (64,), generator=g)
            low = 48 if where == "end" else 0
            ids[low + torch.randperm(64 - low, generator=g)[:2]] = torch.tensor([3 + 2 * label, 4 + 2 * label])
            self.items.append((ids, label))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def truncating(width: int, keep: str, as_dict: bool = False):
    def collate(rows):
        ids = torch.stack([ids for ids, _ in rows])
        ids = ids[:, :width] if keep == "start" else ids[:, -width:]
        labels = torch.tensor([label for _, label in rows])
        if as_dict:
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
        return ids, labels
    return collate


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.EmbeddingBag(200, 16), nn.Linear(16, 3)

    def forward(self, ids):
        return self.head(self.embed(ids))


@pytest.fixture(autouse=True)
def generous_read_budget(monkeypatch):
    """The check reads items for at most BUDGET_S seconds; on a loaded machine that cut the read
    to 128 items, too few for the label probes. The tests judge the items, not the speed."""
    from optimus_preflight.preflight.checks import truncation_signal

    monkeypatch.setattr(truncation_signal, "BUDGET_S", 600.0)


def run(dataset: Dataset, collate):
    model = Bag()
    as_dict = isinstance(collate([dataset[0]]), dict)

    def loss(model, batch):
        ids, labels = (batch["input_ids"], batch["labels"]) if as_dict else batch
        return nn.functional.cross_entropy(model(ids), labels)

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(dataset, batch_size=32, shuffle=True, collate_fn=collate), loss_fn=loss,
                           checks=[FirstBatchCheck(), TruncationSignalCheck()])
    return report.check(NAME)


@pytest.mark.parametrize("as_dict", [False, True], ids=["tuple", "dict"])
def test_keeping_the_start_of_texts_labelled_at_their_end_fires(as_dict):
    result = run(Tickets("end"), truncating(32, "start", as_dict))
    issues = [i for i in result.issues if i.code == "TRUNCATION_DROPS_SIGNAL"]
    assert issues, result.data
    assert "keeps their start" in issues[0].message and "truncation_side='left'" in issues[0].fix
    assert result.data["cut_accuracy"] >= result.data["kept_accuracy"] + 0.3


@pytest.mark.parametrize("dataset, keep", [("end", "end"), ("spread", "start")], ids=["keeps_the_end", "signal_spread"])
def test_truncation_that_keeps_the_signal_stays_quiet(dataset, keep):
    assert_quiet(run(Tickets(dataset), truncating(32, keep)))


def test_texts_that_are_not_cut_stay_quiet():
    result = run(Tickets("end"), truncating(64, "start"))
    assert_quiet(result)
    assert result.data["summary"].startswith("no truncated") or "0 of" in result.data["summary"]


def test_the_kept_end_is_read_through_a_special_token_at_the_front():
    sequence = torch.arange(10, 74)
    row = torch.cat([torch.tensor([1]), sequence[:31]])  # [CLS] + the first 31 tokens
    assert kept_end(row, sequence) == "start"
    assert kept_end(torch.cat([torch.tensor([1]), sequence[-31:]]), sequence) == "end"
    assert kept_end(torch.randint(0, 9, (32,)), sequence) is None
