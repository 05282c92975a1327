"""data.split_tags: VAL_TAG_COLUMNS_RECODED, multi-hot targets binarised with a tag vocabulary
fitted per split (a tag missing from validation shifts the columns after it); one vocabulary
for both splits stays quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.split_tags import SplitTagsCheck

TAGS = ["bird", "car_horn", "dog", "engine", "rain", "siren", "speech", "wind"]
PROTOTYPES = 2 * torch.randn(len(TAGS), 24, generator=torch.Generator().manual_seed(0))


def clips(n: int, seed: int, missing: str | None = None):
    g = torch.Generator().manual_seed(seed)
    allowed = [t for t in TAGS if t != missing]
    tags = [sorted({allowed[int(i)] for i in torch.randint(0, len(allowed), (2,), generator=g)}) for _ in range(n)]
    x = torch.stack([PROTOTYPES[[TAGS.index(t) for t in ts]].sum(0) for ts in tags]) + torch.randn(n, 24, generator=g)
    return x, tags


def binarise(tags, vocabulary):
    y = torch.zeros(len(tags), len(TAGS))
    for row, names in enumerate(tags):
        for name in names:
            y[row, vocabulary.index(name)] = 1.0
    return y


@pytest.mark.parametrize("per_split", [True, False], ids=["vocabulary_per_split", "one_vocabulary"])
def test_tag_columns_shifted_by_a_tag_missing_from_validation(per_split):
    x, tags = clips(2000, 1)
    vx, vtags = clips(400, 2, missing="car_horn")
    vocabulary = sorted({t for ts in tags for t in ts})
    val_vocabulary = sorted({t for ts in vtags for t in ts}) if per_split else vocabulary
    model = nn.Linear(24, len(TAGS))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, binarise(tags, vocabulary)), batch_size=64, shuffle=True),
                           val_loader=DataLoader(TensorDataset(vx, binarise(vtags, val_vocabulary)), batch_size=100),
                           loss_fn=nn.BCEWithLogitsLoss(), checks=[FirstBatchCheck(), SplitTagsCheck()])
    issues = report.check("data.split_tags").issues
    assert bool(issues) == per_split, report.check("data.split_tags").data
    if issues:
        assert "shifted by +1" in issues[0].message and "MultiLabelBinarizer(classes=" in issues[0].fix
