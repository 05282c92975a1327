"""PAIR_PARTNER_IS_ANCHOR: a siamese pair Dataset that returns the anchor as its own
positive partner, and a triplet Dataset whose positive is the anchor, fire; pairs of two
different samples, an autoencoder's (x, x) and a triplet of distinct samples stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.pair_partners import PairPartnersCheck


def speakers(n=600, classes=8):
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, classes, (n,), generator=g)
    return torch.randn(classes, 16, generator=g)[labels] + 0.5 * torch.randn(n, 16, generator=g), labels


class SpeakerPairs(Dataset):
    """(x1, x2, 1.0 if same speaker else 0.0), half positive; the bug returns x[idx] as the partner."""

    def __init__(self, anchor_as_partner: bool):
        self.x, self.speaker = speakers()
        self.by_speaker = {int(c): torch.nonzero(self.speaker == c).flatten() for c in self.speaker.unique()}
        self.anchor_as_partner = anchor_as_partner
        self.g = torch.Generator().manual_seed(1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, idx):
        same = self.by_speaker[int(self.speaker[idx])]
        if torch.rand((), generator=self.g) < 0.5:
            j = int(same[torch.randint(len(same), (1,), generator=self.g)])
            return self.x[idx], self.x[idx] if self.anchor_as_partner else self.x[j], torch.tensor(1.0)
        j = int(torch.randint(len(self.x), (1,), generator=self.g))
        return self.x[idx], self.x[j], torch.tensor(float(self.speaker[j] == self.speaker[idx]))


class Triplets(Dataset):
    def __init__(self, anchor_as_positive: bool):
        self.x, self.label = speakers()
        self.anchor_as_positive = anchor_as_positive

    def __len__(self):
        return len(self.x)

    def __getitem__(self, idx):
        same = torch.nonzero(self.label == self.label[idx]).flatten()
        other = torch.nonzero(self.label != self.label[idx]).flatten()
        positive = self.x[idx] if self.anchor_as_positive else self.x[int(same[(idx * 7) % len(same)])]
        return self.x[idx], positive, self.x[int(other[idx % len(other)])]


def embedder():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def pair_loss(model, batch):
    a, b, same = batch
    distance = (model(a) - model(b)).norm(dim=1)
    return (same * distance ** 2 + (1 - same) * torch.relu(1.0 - distance) ** 2).mean()


def triplet_loss(model, batch):
    return nn.functional.triplet_margin_loss(*(model(t) for t in batch))


def found(dataset, loss_fn):
    model = embedder()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(dataset, batch_size=32, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), PairPartnersCheck()])
    return [i for i in report.check("data.pair_partners").issues if i.code == "PAIR_PARTNER_IS_ANCHOR"]


@pytest.mark.parametrize("bug", [True, False])
def test_a_positive_pair_of_the_anchor_with_itself_fires(bug):
    issues = found(SpeakerPairs(anchor_as_partner=bug), pair_loss)
    assert bool(issues) == bug
    if bug:
        assert "labelled 1" in issues[0].message and "self.x[j]" in issues[0].fix


@pytest.mark.parametrize("bug", [True, False])
def test_a_triplet_whose_positive_is_the_anchor_fires(bug):
    issues = found(Triplets(anchor_as_positive=bug), triplet_loss)
    assert bool(issues) == bug
    if bug:
        assert "the positive is the anchor itself" in issues[0].message


def test_an_autoencoders_input_as_its_own_target_is_quiet():
    x, _ = speakers()
    model = nn.Sequential(nn.Linear(16, 4), nn.Linear(4, 16))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, x, torch.ones(len(x))), batch_size=32, shuffle=True),
                           loss_fn=lambda m, b: ((m(b[0]) - b[1]) ** 2).mean(1).mul(b[2]).mean(),
                           checks=[FirstBatchCheck(), PairPartnersCheck()])
    assert not report.check("data.pair_partners").issues
