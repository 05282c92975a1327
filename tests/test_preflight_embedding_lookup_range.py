"""EMBEDDING_LOOKUP_RANGE (model.embedding_inputs): one item table read for positives that span
the catalogue and for negatives drawn from a smaller range (randint(0, n_users)); negatives from
the whole catalogue, and categorical fields given their own ranges of one table, stay quiet.
EMBEDDING_IDS_BROADCAST: user ids collated to (B, 1) beside item ids (B,) give (B, B) scores;
scalar ids, and a two-tower model's deliberate (B, B) in-batch scores, stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.embedding_inputs import EmbeddingInputsCheck, short_lookup
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

USERS, ITEMS = 80, 480


class Triplets(Dataset):
    """(user, positive item, sampled negative item) for BPR."""

    def __init__(self, negatives_from: int):
        g = torch.Generator().manual_seed(0)
        self.users = torch.randint(0, USERS, (2000,), generator=g)
        self.items = torch.randint(0, ITEMS, (2000,), generator=g)
        self.negatives = torch.randint(0, negatives_from, (2000,), generator=g)

    def __len__(self):
        return 2000

    def __getitem__(self, i):
        return self.users[i], self.items[i], self.negatives[i]


class MF(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.user, self.item = nn.Embedding(USERS, 16), nn.Embedding(ITEMS, 16)

    def forward(self, users, items):
        return (self.user(users) * self.item(items)).sum(-1)


def bpr(model, batch):
    users, positives, negatives = batch
    return -F.logsigmoid(model(users, positives) - model(users, negatives)).mean()


@pytest.mark.parametrize("negatives_from", [USERS, ITEMS], ids=["n_users", "n_items"])
def test_negatives_drawn_from_the_users_range(negatives_from):
    model = MF()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(Triplets(negatives_from), batch_size=128, shuffle=True), loss_fn=bpr,
                           checks=[FirstBatchCheck(), FirstStepCheck(), EmbeddingInputsCheck()])
    found = [i for i in report.check("model.embedding_inputs").issues if i.code == "EMBEDDING_LOOKUP_RANGE"]
    assert bool(found) == (negatives_from == USERS)
    if found:
        assert "'item' (480 rows)" in found[0].message and "randint(0, 480" in found[0].fix


class ReseededNegatives(Triplets):
    """The negative drawn in __getitem__ from a generator seeded on every call: the same item always."""

    def __getitem__(self, i):
        negative = torch.randint(0, ITEMS, (), generator=torch.Generator().manual_seed(0))
        return self.users[i], self.items[i], negative


def test_a_negative_sampler_reseeded_on_every_call_names_the_one_row():
    model = MF()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(ReseededNegatives(ITEMS), batch_size=128, shuffle=True), loss_fn=bpr,
                           checks=[FirstBatchCheck(), FirstStepCheck(), EmbeddingInputsCheck()])
    found = [i for i in report.check("model.embedding_inputs").issues if i.code == "EMBEDDING_LOOKUP_RANGE"]
    assert len(found) == 1 and "every time" in found[0].message and "Seed the sampler once" in found[0].fix


def test_fields_with_their_own_ranges_of_one_table_are_no_short_lookup():
    # field 0 in rows 0-9, field 1 in rows 10-999: the second starts where the first ends
    assert short_lookup([(128, 0, 9), (128, 10, 998)], 1000) is None
    assert short_lookup([(128, 0, 78), (128, 2, 477)], 480) == (78, 477)
    assert short_lookup([(16, 0, 78), (128, 2, 477)], 480) is None  # too few ids to say where they stop


class OneElementIds(Triplets):
    """The same triplets with the user returned as a one-element tensor: collated to (B, 1)."""

    def __getitem__(self, i):
        user, positive, negative = super().__getitem__(i)
        return user.reshape(1), positive, negative


class TwoTower(MF):
    """In-batch scores on purpose: every user against every item of the batch, (B, B)."""

    def forward(self, users, items):
        return self.user(users) @ self.item(items).T


def in_batch_softmax(model, batch):
    users, positives, _ = batch
    scores = model(users, positives)
    return F.cross_entropy(scores, torch.arange(len(users), device=scores.device))


@pytest.mark.parametrize("case", ["one_element_user_ids", "scalar_ids", "two_tower_in_batch"])
def test_user_ids_of_shape_b_1_broadcast_against_item_ids(case):
    model = TwoTower() if case == "two_tower_in_batch" else MF()
    dataset = OneElementIds(ITEMS) if case == "one_element_user_ids" else Triplets(ITEMS)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(dataset, batch_size=128, shuffle=True),
                           loss_fn=in_batch_softmax if case == "two_tower_in_batch" else bpr,
                           checks=[FirstBatchCheck(), FirstStepCheck(), EmbeddingInputsCheck()])
    found = [i for i in report.check("model.embedding_inputs").issues if i.code == "EMBEDDING_IDS_BROADCAST"]
    assert bool(found) == (case == "one_element_user_ids")
    if found:
        assert "(128, 1) ('user')" in found[0].message and "squeeze(-1)" in found[0].fix


class HashedCategoryCTR(nn.Module):
    def __init__(self, buckets: int = 4096, width: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.products, self.head = nn.Embedding(buckets, width), nn.Linear(width, 1)

    def forward(self, ids):
        return self.head(self.products(ids)).squeeze(-1)


@pytest.mark.parametrize("modulo, fires", [(16, True), (4096, False)], ids=["width", "buckets"])
def test_hashed_ids_folded_onto_the_embedding_width(modulo, fires):
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 10 ** 6, (2048,), generator=g)
    ids = (raw * 2654435761) % (2 ** 32) % modulo  # the hashing trick, reduced modulo `modulo`
    clicks = torch.randint(0, 2, (2048,), generator=g).float()
    model = HashedCategoryCTR()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids, clicks), batch_size=64, shuffle=True),
                           loss_fn=nn.BCEWithLogitsLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), EmbeddingInputsCheck()])
    found = [i for i in report.check("model.embedding_inputs").issues if i.code == "EMBEDDING_LOOKUP_RANGE"]
    assert bool(found) == fires
    if fires:
        assert "width 16" in found[0].message and "% 4096" in found[0].fix


class JointTable(nn.Module):
    """Users and items in one table of USERS + ITEMS rows; the item ids offset by USERS, or not."""

    def __init__(self, offset: bool):
        super().__init__()
        torch.manual_seed(0)
        self.table, self.offset = nn.Embedding(USERS + ITEMS, 16), offset

    def forward(self, users, items):
        return (self.table(users) * self.table(items + (USERS if self.offset else 0))).sum(-1)


@pytest.mark.parametrize("offset", [False, True], ids=["items_from_0", "items_offset_by_users"])
def test_one_table_for_users_and_items_needs_the_items_offset(offset):
    model = JointTable(offset)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(Triplets(ITEMS), batch_size=128, shuffle=True), loss_fn=bpr,
                           checks=[FirstBatchCheck(), FirstStepCheck(), EmbeddingInputsCheck()])
    found = [i for i in report.check("model.embedding_inputs").issues if i.code == "EMBEDDING_FIELDS_SHARE_IDS"]
    assert bool(found) == (not offset)
    if found:
        assert f"'table' has {USERS + ITEMS} rows" in found[0].message and "item_ids + n_users" in found[0].fix
