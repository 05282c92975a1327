"""data.pair_association: image / caption pairs whose captions were read through a separately
shuffled index in the training split (PAIRS_UNRELATED) while the validation pairs belong
together; pairs kept together, and pairs unrelated in validation too, stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.pair_association import PairAssociationCheck, neighbour_overlap


class Captioned(Dataset):
    """Two noisy non-linear maps of one latent: an 'image' vector and a 'caption' vector."""

    def __init__(self, rows: int, seed: int, shuffled_captions: bool = False, related: bool = True):
        g = torch.Generator().manual_seed(seed)
        z = torch.randn(rows, 6, generator=g)
        to_image = torch.randn(6, 32, generator=torch.Generator().manual_seed(90))
        to_text = torch.randn(6, 20, generator=torch.Generator().manual_seed(91))
        self.image = torch.tanh(z @ to_image) + 0.1 * torch.randn(rows, 32, generator=g)
        source = z if related else torch.randn(rows, 6, generator=g)
        self.text = torch.sin(source @ to_text / 2) + 0.1 * torch.randn(rows, 20, generator=g)
        self.order = torch.randperm(rows, generator=g) if shuffled_captions else torch.arange(rows)

    def __len__(self):
        return len(self.image)

    def __getitem__(self, i):
        return self.image[i], self.text[self.order[i]]


class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.image, self.text = nn.Linear(32, 16), nn.Linear(20, 16)

    def forward(self, image, text):
        return F.normalize(self.image(image), dim=1) @ F.normalize(self.text(text), dim=1).T / 0.1


def clip_loss(model, batch):
    logits = model(*batch)
    return F.cross_entropy(logits, torch.arange(len(logits)))


@pytest.mark.parametrize("training, validation, fires", [
    ("shuffled", "related", True), ("related", "related", False), ("unrelated", "unrelated", False)])
def test_training_pairs_taken_apart_are_named(training, validation, fires):
    train = Captioned(1024, 0, shuffled_captions=training == "shuffled", related=training != "unrelated")
    val = Captioned(256, 5, related=validation == "related")
    model = TwoTowers()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(train, batch_size=64, shuffle=True), val_loader=DataLoader(val, batch_size=64),
                           loss_fn=clip_loss, checks=[FirstBatchCheck(), PairAssociationCheck()])
    result = report.check("data.pair_association")
    assert [i.code for i in result.issues] == (["PAIRS_UNRELATED"] if fires else []), result.data
    if fires:
        assert "txt[order[i]]" in result.issues[0].message and "same i" in result.issues[0].fix


def test_the_overlap_of_a_pair_with_itself_is_complete_and_of_noise_near_chance():
    x = torch.randn(200, 8, generator=torch.Generator().manual_seed(0))
    assert neighbour_overlap(x, x * 3 + 1) == 1.0
    assert neighbour_overlap(x, torch.randn(200, 8, generator=torch.Generator().manual_seed(1))) < 0.15
