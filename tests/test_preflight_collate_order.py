"""data.collate_order: a collate_fn that reorders inputs and labels differently (sorted by
length for packing, labels in arrival order); collates that keep samples together, sort
everything with one order, or mask at random stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.collate_order import CollateOrderCheck, disagreeing
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck


class Utterances(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.lengths = torch.randint(3, 20, (200,), generator=g).tolist()
        self.seqs = [torch.randint(1, 50, (n,), generator=g) for n in self.lengths]
        self.labels = torch.randint(0, 3, (200,), generator=g).tolist()

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return self.seqs[i], self.labels[i]


def sorts_inputs_only(rows):
    seqs = sorted([r[0] for r in rows], key=len, reverse=True)
    labels = torch.tensor([r[1] for r in rows])
    return pad_sequence(seqs, batch_first=True), torch.tensor([len(s) for s in seqs]), labels


def sorts_everything(rows):
    rows = sorted(rows, key=lambda r: len(r[0]), reverse=True)
    return (pad_sequence([r[0] for r in rows], batch_first=True), torch.tensor([len(r[0]) for r in rows]),
            torch.tensor([r[1] for r in rows]))


def keeps_order(rows):
    return {"ids": pad_sequence([r[0] for r in rows], batch_first=True),
            "lengths": torch.tensor([len(r[0]) for r in rows]), "labels": torch.tensor([r[1] for r in rows])}


def masks_at_random(rows):
    ids = pad_sequence([r[0] for r in rows], batch_first=True)
    masked = ids.masked_fill(torch.rand(ids.shape) < 0.15, 99)
    return masked, torch.where(masked == 99, ids, -100)


def draws_a_patch_mask(rows):
    """MAE: a 75% mask over 4 patches drawn per batch, whose rows repeat by chance (4 masks possible)."""
    ids = pad_sequence([r[0] for r in rows], batch_first=True)
    return ids, torch.rand(len(rows), 4).argsort(1) < 3


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(100, 8), nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(1))


def loss(model, batch):
    if isinstance(batch, dict):
        return nn.functional.cross_entropy(model(batch["ids"]), batch["labels"])
    if len(batch) == 2:  # the masked-LM batch: any loss will do, the check reads the collate only
        return model(batch[0]).logsumexp(-1).mean()
    return nn.functional.cross_entropy(model(batch[0]), batch[2])


@pytest.mark.parametrize("collate, fires", [(sorts_inputs_only, True), (sorts_everything, False),
                                            (keeps_order, False), (masks_at_random, False),
                                            (draws_a_patch_mask, False)],
                         ids=["sorts_inputs_only", "sorts_everything", "keeps_order", "masks_at_random",
                              "draws_a_patch_mask"])
def test_only_a_collate_that_reorders_tensors_differently_fires(collate, fires):
    model = Classifier()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(Utterances(), batch_size=16, shuffle=True, collate_fn=collate), loss_fn=loss,
                           checks=[FirstBatchCheck(), CollateOrderCheck()])
    issues = [i for i in report.check("data.collate_order").issues if i.code == "DATA_COLLATE_ORDER"]
    assert bool(issues) == fires, report.check("data.collate_order").data
    if fires:
        assert "batch[0]" in issues[0].message and "batch[2]" in issues[0].message
        assert "enforce_sorted=False" in issues[0].fix


def test_labels_with_repeated_values_are_judged_against_the_inputs_order():
    ids = torch.arange(8)[:, None].repeat(1, 3)
    labels = torch.tensor([0, 0, 1, 1, 0, 1, 1, 0])
    assert disagreeing((ids, labels), (ids.flip(0), labels.flip(0)), 8) is None
    assert disagreeing((ids, labels), (ids, labels.flip(0)), 8) == (0, 1)


class Listings(Dataset):
    """Rental listings: a city name and two numeric columns; the label follows the city."""

    def __init__(self):
        g = torch.Generator().manual_seed(3)
        self.cities = [f"city_{int(i):02d}" for i in torch.randint(0, 12, (300,), generator=g)]
        self.numbers = torch.randn(300, 2, generator=g)
        self.labels = [int(city[-2:]) % 2 for city in self.cities]

    def __len__(self):
        return len(self.cities)

    def __getitem__(self, i):
        return self.cities[i], self.numbers[i], self.labels[i]


def encode_cities(mapping):
    """mapping=None: codes in order of first appearance in each batch (pd.factorize per batch)."""
    def collate(rows):
        table = mapping if mapping is not None else {}
        if mapping is None:
            for city, _, _ in rows:
                table.setdefault(city, len(table))
        return (torch.tensor([table[city] for city, _, _ in rows]), torch.stack([r[1] for r in rows]),
                torch.tensor([r[2] for r in rows]))
    return collate


class CityModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.city, self.head = nn.Embedding(12, 4), nn.Linear(6, 2)

    def forward(self, codes, numbers):
        return self.head(torch.cat([self.city(codes), numbers], 1))


@pytest.mark.parametrize("fitted_once", [False, True], ids=["coded_per_batch", "mapping_fitted_once"])
def test_category_codes_assigned_per_batch_fire(fitted_once):
    data = Listings()
    mapping = {city: i for i, city in enumerate(sorted(set(data.cities)))} if fitted_once else None
    model = CityModel()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(data, batch_size=32, shuffle=True, collate_fn=encode_cities(mapping)),
                           loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0], b[1]), b[2]),
                           checks=[FirstBatchCheck(), CollateOrderCheck()])
    issues = report.check("data.collate_order").issues
    assert [i.code for i in issues] == ([] if fitted_once else ["DATA_COLLATE_RECODES"])
    if not fitted_once:
        assert "batch[0]" in issues[0].message and "pd.factorize" in issues[0].message
        assert "once, on the training split" in issues[0].fix


class OneHotCityModel(nn.Module):
    """The city read through F.one_hot, a conditional model's category input."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(14, 2)

    def forward(self, codes, numbers):
        return self.head(torch.cat([nn.functional.one_hot(codes, 12).float(), numbers], 1))


def test_codes_assigned_per_batch_and_read_through_one_hot_fire():
    model = OneHotCityModel()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(Listings(), batch_size=32, shuffle=True, collate_fn=encode_cities(None)),
                           loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0], b[1]), b[2]),
                           checks=[FirstBatchCheck(), CollateOrderCheck()])
    assert [i.code for i in report.check("data.collate_order").issues] == ["DATA_COLLATE_RECODES"]


def test_episode_labels_numbered_per_batch_are_neither_recoded_ids_nor_a_reordering():
    # few-shot episodes: the labels are renumbered 0..N-1 in each episode on purpose and are no embedding's ids
    data = Listings()

    def episode(rows):
        order: dict[str, int] = {}
        labels = [order.setdefault(city, len(order)) for city, _, _ in rows]
        return torch.stack([r[1] for r in rows]), torch.tensor(labels)

    model = nn.Linear(2, 12)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(data, batch_size=32, shuffle=True, collate_fn=episode),
                           loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]),
                           checks=[FirstBatchCheck(), CollateOrderCheck()])
    assert report.check("data.collate_order").issues == []


def graph_samples(n: int = 64) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        size = int(torch.randint(5, 10, (1,), generator=g))
        kinds = torch.nn.functional.one_hot(torch.randint(0, 3, (size,), generator=g), 3).float()
        src = torch.randint(0, size, (2 * size,), generator=g)
        dst = torch.randint(0, size, (2 * size,), generator=g)
        out.append((kinds, torch.stack([src, dst]), int(kinds[:, 0].sum() > size / 3)))
    return out


def graph_collate(labels_sorted_by_edges: bool):
    def join(rows):
        xs, edges, owner, start = [], [], [], 0
        for k, (x, edge_index, _) in enumerate(rows):
            xs.append(x), edges.append(edge_index + start), owner.append(torch.full((len(x),), k))
            start += len(x)
        ordered = sorted(rows, key=lambda r: r[1].shape[1] + len(r[0])) if labels_sorted_by_edges else rows
        return torch.cat(xs), torch.cat(edges, 1), torch.cat(owner), torch.tensor([r[2] for r in ordered])
    return join


class GraphReader(nn.Module):
    def __init__(self):
        super().__init__()
        self.node, self.head = nn.Linear(3, 8), nn.Linear(8, 2)

    def forward(self, x, edge_index, owner, graphs):
        h = torch.relu(self.node(x))
        h = h + torch.zeros_like(h).index_add_(0, edge_index[1], h[edge_index[0]])
        return self.head(torch.zeros(graphs, h.shape[1]).index_add_(0, owner, h))


@pytest.mark.parametrize("labels_sorted", [True, False], ids=["labels_sorted_apart", "labels_in_graph_order"])
def test_graph_labels_ordered_apart_from_the_graphs_fire(labels_sorted):
    model = GraphReader()

    def graph_loss(m, batch):
        x, edge_index, owner, y = batch
        return nn.functional.cross_entropy(m(x, edge_index, owner, len(y)), y)

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(graph_samples(), batch_size=16, shuffle=True,
                                      collate_fn=graph_collate(labels_sorted)),
                           loss_fn=graph_loss, checks=[FirstBatchCheck(), CollateOrderCheck()])
    issues = [i for i in report.check("data.collate_order").issues if i.code == "DATA_COLLATE_ORDER"]
    assert bool(issues) == labels_sorted
    if issues:
        assert "node blocks" in issues[0].message and "batch[3]" in issues[0].message
