"""TRIPLET_POSITIVES_RANDOM: a triplet Dataset that draws its positives from any class."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.triplet_positives import TripletPositivesCheck

CENTRES = torch.randn(10, 20, generator=torch.Generator().manual_seed(0)) * 0.5


def identities(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (rows,), generator=g)
    return CENTRES[y] + torch.randn(rows, 20, generator=g), y


class Triplets(Dataset):
    def __init__(self, positives_from_anchor_class: bool):
        self.x, self.y = identities(2000, 1)
        self.by_class = [torch.nonzero(self.y == c).flatten() for c in range(10)]
        self.own = positives_from_anchor_class
        self.g = torch.Generator().manual_seed(2)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        c = int(self.y[i])
        positive_class = c if self.own else int(torch.randint(0, 10, (1,), generator=self.g))
        negative_class = (c + 1 + int(torch.randint(0, 9, (1,), generator=self.g))) % 10
        pick = lambda k: self.x[self.by_class[k][torch.randint(0, len(self.by_class[k]), (1,), generator=self.g)]][0]  # noqa: E731
        return self.x[i], pick(positive_class), pick(negative_class)


@pytest.mark.parametrize("own_class", [False, True], ids=["positives_from_any_class", "positives_from_anchor_class"])
def test_triplet_positives_drawn_from_any_class(own_class):
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 8))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(Triplets(own_class), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(*identities(400, 3)), batch_size=200),
                           loss_fn=lambda m, b: F.triplet_margin_loss(m(b[0]), m(b[1]), m(b[2])),
                           checks=[FirstBatchCheck(), TripletPositivesCheck()])
    result = report.check("data.triplet_positives")
    assert [i.code for i in result.issues] == ([] if own_class else ["TRIPLET_POSITIVES_RANDOM"]), result.data
    if result.issues:
        assert "random class" in result.issues[0].message and "anchor's class" in result.issues[0].fix


@pytest.mark.parametrize("own_class", [False, True], ids=["positives_from_any_class", "positives_from_anchor_class"])
def test_a_validation_split_of_triplets_gives_the_separation_too(own_class):
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 8))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(Triplets(own_class), batch_size=64, shuffle=True),
                           val_loader=DataLoader(Triplets(True), batch_size=200),
                           loss_fn=lambda m, b: F.triplet_margin_loss(m(b[0]), m(b[1]), m(b[2])),
                           checks=[FirstBatchCheck(), TripletPositivesCheck()])
    result = report.check("data.triplet_positives")
    assert [i.code for i in result.issues] == ([] if own_class else ["TRIPLET_POSITIVES_RANDOM"]), result.data
