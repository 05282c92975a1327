"""Inputs that are a few ids or categories (a user and an item, label-encoded columns) repeat
by nature: an equal sample in both splits is the same point drawn twice (LEAK_SPLIT is a note
when training repeats itself as often), and an id with several labels is the task (no
LABEL_CONFLICT). Copied rows of float features, and leaked ids, still warn."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.embedding_inputs import EmbeddingInputsCheck
from optimus_preflight.preflight.checks.split_labels import SplitLabelsCheck
from optimus_preflight.preflight.checks.split_overlap import SplitOverlapCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


class Scorer(nn.Module):
    def __init__(self, vocab: int, out: int):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, 8)
        self.head = nn.Linear(8, out)

    def forward(self, ids):
        return self.head(self.embed(ids))


def claims(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four label-encoded columns of 10 values each (offset per field), a binary label."""
    g = torch.Generator().manual_seed(seed)
    fields = torch.randint(0, 10, (n, 4), generator=g) + torch.arange(4) * 10
    return fields, (fields.sum(1) + torch.randint(0, 20, (n,), generator=g) > 90).long()


def findings(train: tuple, val: tuple, vocab: int, out: int) -> dict[str, list]:
    model = Scorer(vocab, out)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(*train), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(*val), batch_size=64), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), SplitOverlapCheck(), SplitLabelsCheck()])
    found: dict[str, list] = {}
    for check in report.checks:
        for issue in check.issues:
            found.setdefault(issue.code, []).append(issue)
    return found


def test_categorical_rows_drawn_twice_are_a_note_not_a_leak():
    found = findings(claims(4000, 0), claims(500, 1), 40, 2)
    assert [i.severity.value for i in found.get("LEAK_SPLIT", [])] == ["info"]
    assert "same point drawn twice" in found["LEAK_SPLIT"][0].message


def test_categorical_rows_copied_into_validation_still_leak():
    x, y = claims(2000, 0)
    g = torch.Generator().manual_seed(5)
    fields = torch.randint(0, 10**6, (2000, 4), generator=g)  # ids from a large space: no chance twins
    copied = torch.randperm(2000, generator=g)[:400]
    found = findings((fields, y), (fields[copied], y[copied]), 10**6, 2)
    assert [i.severity.value for i in found["LEAK_SPLIT"]] == ["warning"]


def test_users_with_several_chosen_items_are_no_label_conflict():
    g = torch.Generator().manual_seed(2)
    users = torch.randint(0, 50, (3000, 1), generator=g)
    items = (users[:, 0] * 7 + torch.randint(0, 5, (3000,), generator=g)) % 40
    found = findings((users, items), (users[:300], items[:300]), 50, 40)
    assert "LABEL_CONFLICT" not in found


class FieldBag(nn.Module):
    """Four label-encoded fields looked up in one table sized for all of them."""

    def __init__(self, offsets: bool):
        super().__init__()
        torch.manual_seed(0)
        cards = [10, 10, 10, 10]
        self.register_buffer("offsets", torch.tensor([0, 10, 20, 30]) if offsets else torch.zeros(4, dtype=torch.long))
        self.bag = nn.EmbeddingBag(sum(cards), 8, mode="sum")
        self.head = nn.Linear(8, 2)

    def forward(self, fields):
        return self.head(self.bag(fields + self.offsets))


@pytest.mark.parametrize("offsets", [False, True])
def test_categorical_fields_sharing_one_id_space(offsets):
    from optimus_preflight.preflight.checks.embedding_inputs import EmbeddingInputsCheck
    from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

    g = torch.Generator().manual_seed(0)
    fields = torch.randint(0, 10, (512, 4), generator=g)
    model = FieldBag(offsets)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(fields, torch.randint(0, 2, (512,), generator=g)), batch_size=64),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), EmbeddingInputsCheck()])
    found = [i for i in report.check("model.embedding_inputs").issues if i.code == "EMBEDDING_FIELDS_SHARE_IDS"]
    if offsets:
        assert not found
    else:
        assert len(found) == 1 and "rows 10..39 are never used" in found[0].message and "cumsum" in found[0].fix


class OrderModel(nn.Module):
    def __init__(self, by: str):
        super().__init__()
        torch.manual_seed(0)
        self.by = by
        # sized like the vocabulary where the token ids are looked up, as the bug usually comes
        self.tokens, self.pos = nn.Embedding(50, 16), nn.Embedding(50 if by == "tokens" else 10, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        if self.by == "tokens":
            positions = self.pos(x)  # the token ids where the positions were meant
        elif self.by == "left_padded":
            positions = self.pos((x > 0).long().cumsum(1) - 1 + (x == 0).long())  # per-sample positions
        else:
            positions = self.pos(torch.arange(x.shape[1]))
        return self.head((self.tokens(x) + positions).mean(1))


@pytest.mark.parametrize("by", ["tokens", "arange", "left_padded"])
def test_a_position_table_looked_up_with_token_ids(by):
    from optimus_preflight.preflight.checks.embedding_inputs import EmbeddingInputsCheck
    from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 50, (256, 10), generator=g)
    ids[:, :2] = torch.where(torch.rand(256, 2, generator=g) < 0.3, 0, ids[:, :2])
    model = OrderModel(by)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids, torch.randint(0, 2, (256,), generator=g)), batch_size=32),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), EmbeddingInputsCheck()])
    found = [i for i in report.check("model.embedding_inputs").issues if i.code == "POSITION_EMBEDDING_TOKEN_IDS"]
    assert bool(found) == (by == "tokens")


def _bag_batches(correct_offsets: bool) -> DataLoader:
    g = torch.Generator().manual_seed(5)
    texts = [torch.randint(0, 50, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g) for _ in range(256)]
    labels = [int((t < 25).float().mean() > 0.5) for t in texts]

    def collate(samples):
        tokens = torch.cat([t for t, _ in samples])
        lengths = torch.tensor([len(t) for t, _ in samples])
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]]) if correct_offsets \
            else torch.arange(len(samples))  # the bug: bag indices, not where each bag starts
        return tokens, offsets, torch.tensor([y for _, y in samples])

    return DataLoader(list(zip(texts, labels)), batch_size=32, shuffle=True, collate_fn=collate)


class BagClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bag, self.head = nn.EmbeddingBag(50, 16), nn.Linear(16, 2)

    def forward(self, tokens, offsets):
        return self.head(self.bag(tokens, offsets))


@pytest.mark.parametrize("correct_offsets", [False, True])
def test_embeddingbag_offsets_that_are_bag_indices_fire_and_collated_offsets_are_not_per_sample(correct_offsets):
    from optimus_preflight.preflight.checks.collate_context import CollateContextCheck
    from optimus_preflight.preflight.checks.collate_order import CollateOrderCheck

    model = BagClassifier()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2), _bag_batches(correct_offsets),
                           loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]),
                           checks=[FirstBatchCheck(), FirstStepCheck(), EmbeddingInputsCheck(), CollateOrderCheck(),
                                   CollateContextCheck()])
    loud = {issue.code for _, issue in report.issues() if issue.severity.value in ("warning", "error")}
    assert loud == (set() if correct_offsets else {"EMBEDDINGBAG_OFFSETS"})
    if not correct_offsets:
        issue = next(issue for _, issue in report.issues() if issue.code == "EMBEDDINGBAG_OFFSETS")
        assert "offsets 0, 1, ..., 31" in issue.message and "lengths.cumsum(0)[:-1]" in issue.fix


@pytest.mark.parametrize(("padding_idx", "fires"), [(0, True), (None, False), (50, False)],
                         ids=["id_0_is_a_word", "no_padding_idx", "pad_row_never_read"])
def test_a_padding_idx_on_flat_bags_names_the_word_it_drops(padding_idx, fires):
    """Flat ids cut by offsets hold no padding: an EmbeddingBag's padding_idx that the ids
    contain drops a real word from every bag (ids 0-49 are words here)."""
    from optimus_preflight.preflight.checks.embedding_inputs import EmbeddingInputsCheck
    from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

    model = BagClassifier()
    model.bag = nn.EmbeddingBag(51, 16, padding_idx=padding_idx)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2), _bag_batches(correct_offsets=True),
                           loss_fn=lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]),
                           checks=[FirstBatchCheck(), FirstStepCheck(), EmbeddingInputsCheck()])
    found = [i for i in report.check("model.embedding_inputs").issues if i.code == "EMBEDDING_PADDING_IDX"]
    assert bool(found) == fires
    if fires:
        assert "EmbeddingBag(padding_idx=0)" in found[0].message and "nothing is padded" in found[0].message
