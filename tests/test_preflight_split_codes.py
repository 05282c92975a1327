"""data.split_codes: VAL_IDS_RECODED, category ids encoded per split (validation's own mapping),
read from the per-id mean target; one mapping for both splits, and ids that do not matter,
stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.split_codes import SplitCodesCheck

CITIES = [f"city_{i}" for i in range(20)]


class RentNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.city = nn.Embedding(len(CITIES), 4)
        self.out = nn.Linear(4 + 3, 1)

    def forward(self, code, x):
        return self.out(torch.cat([self.city(code), x], 1)).squeeze(1)


def rentals(n: int, seed: int, city_matters: bool = True):
    g = torch.Generator().manual_seed(seed)
    city = [CITIES[i] for i in torch.randint(0, len(CITIES), (n,), generator=g).tolist()]
    level = torch.linspace(-2, 2, len(CITIES)) if city_matters else torch.zeros(len(CITIES))
    x = torch.randn(n, 3, generator=g)
    rent = torch.stack([level[CITIES.index(c)] for c in city]) + 0.5 * x[:, 0] + 0.1 * torch.randn(n, generator=g)
    return city, x, rent


def recoded(val_mapping: str, city_matters: bool = True) -> list:
    city, x, rent = rentals(3000, 0, city_matters)
    vcity, vx, vrent = rentals(600, 1, city_matters)
    train_codes = {c: i for i, c in enumerate(sorted(set(city)))}
    val_codes = train_codes if val_mapping == "shared" else {c: i for i, c in enumerate(dict.fromkeys(vcity))}
    train = TensorDataset(torch.tensor([train_codes[c] for c in city]), x, rent)
    val = TensorDataset(torch.tensor([val_codes[c] for c in vcity]), vx, vrent)
    model = RentNet()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(train, batch_size=64, shuffle=True), val_loader=DataLoader(val, batch_size=100),
                           loss_fn=lambda m, b: F.mse_loss(m(b[0], b[1]), b[2]),
                           checks=[FirstBatchCheck(), SplitCodesCheck()])
    return [i for i in report.check("data.split_codes").issues if i.code == "VAL_IDS_RECODED"]


@pytest.mark.parametrize("val_mapping", ["own", "shared"])
def test_validation_ids_encoded_with_their_own_mapping_are_named(val_mapping):
    found = recoded(val_mapping)
    if val_mapping == "own":
        assert len(found) == 1 and "mean other categories in validation" in found[0].message
        assert "same mapping" in found[0].fix
    else:
        assert not found


def test_ids_the_target_does_not_depend_on_say_nothing():
    assert recoded("own", city_matters=False) == []


class RentTable(nn.Module):
    """The codes kept in the float feature table (column 0) and cast for the embedding in forward."""

    def __init__(self):
        super().__init__()
        self.city = nn.Embedding(len(CITIES), 4)
        self.out = nn.Linear(4 + 3, 1)

    def forward(self, table):
        return self.out(torch.cat([self.city(table[:, 0].long()), table[:, 1:]], 1)).squeeze(1)


@pytest.mark.parametrize("val_mapping", ["own", "shared"])
def test_codes_kept_as_floats_in_the_feature_table_are_read_too(val_mapping):
    from optimus_preflight.preflight.checks.coded_columns import CodedColumnsCheck

    level = 2 * torch.randn(len(CITIES), generator=torch.Generator().manual_seed(3))  # unordered city effects

    def rows(n, seed):
        g = torch.Generator().manual_seed(seed)
        index, x = torch.randint(0, len(CITIES), (n,), generator=g), torch.randn(n, 3, generator=g)
        return [CITIES[i] for i in index.tolist()], x, level[index] + 0.5 * x[:, 0] + 0.1 * torch.randn(n, generator=g)

    city, x, rent = rows(3000, 0)
    vcity, vx, vrent = rows(600, 1)
    train_codes = {c: i for i, c in enumerate(sorted(set(city)))}
    val_codes = train_codes if val_mapping == "shared" else {c: i for i, c in enumerate(dict.fromkeys(vcity))}
    table = torch.cat([torch.tensor([float(train_codes[c]) for c in city])[:, None], x], 1)
    vtable = torch.cat([torch.tensor([float(val_codes[c]) for c in vcity])[:, None], vx], 1)
    model = RentTable()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(table, rent), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(vtable, vrent), batch_size=100),
                           loss_fn=lambda m, b: F.mse_loss(m(b[0]), b[1]),
                           checks=[FirstBatchCheck(), SplitCodesCheck(), CodedColumnsCheck()])
    found = [i for i in report.check("data.split_codes").issues if i.code == "VAL_IDS_RECODED"]
    assert bool(found) == (val_mapping == "own")
    # The column is looked up in an embedding: category codes, never 'codes fed as numbers'.
    assert report.check("data.coded_columns").issues == []


@pytest.mark.parametrize("mapping", ["own", "shared"])
def test_sorted_per_split_codes_that_keep_some_categories_in_place_are_named(mapping):
    """A sorted per-split encoder (LabelEncoder) over a validation period missing 10 of 40 stores:
    most ids shift, a few keep or land on a similar store by chance, and some agreement between the
    splits survives (0.35 here). Ids deciding the target (halves at 0.9+) that lose over half of it
    are recoded; one shared mapping stays quiet."""
    g = torch.Generator().manual_seed(5)
    level = torch.randn(40, generator=g) * 2  # each store its own level, in no order
    missing = torch.randperm(40, generator=g)[:10].tolist()

    def period(n: int, stores: list[int]):
        pick = torch.tensor(stores)[torch.randint(0, len(stores), (n,), generator=g)]
        return pick, level[pick] + 0.3 * torch.randn(n, generator=g)

    store, sales = period(3000, list(range(40)))
    vstore, vsales = period(1200, [s for s in range(40) if s not in missing])
    val_codes = torch.searchsorted(vstore.unique(), vstore) if mapping == "own" else vstore
    model = nn.Embedding(40, 1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(store, sales), batch_size=64),
                           val_loader=DataLoader(TensorDataset(val_codes, vsales), batch_size=100),
                           loss_fn=lambda m, b: F.mse_loss(m(b[0]).squeeze(-1), b[1]),
                           checks=[FirstBatchCheck(), SplitCodesCheck()])
    found = [i.code for i in report.check("data.split_codes").issues]
    assert found == (["VAL_IDS_RECODED"] if mapping == "own" else [])
