"""data.sample_standardised: input fields standardised each with its own mean and std while the
regression targets scale with the erased amplitude fire; statistics from the training set, class
targets over z-normalised series (a convention) and targets of one scale stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.sample_standardised import SampleStandardisedCheck, standardised_channels

POINTS = 32


class Fields(Dataset):
    """Coefficient fields a(x) of random amplitude and offset on a grid, and a solution that scales
    with them; the input is (normalised field, grid)."""

    def __init__(self, per_sample: bool, classes: bool = False, scaled_targets: bool = False):
        g = torch.Generator().manual_seed(0)
        self.grid = torch.linspace(0, 1, POINTS)
        amplitude = 10 ** torch.empty(256, 1).uniform_(0, 1.5, generator=g)
        self.a = amplitude * (1.5 + torch.sin(6.28 * self.grid + torch.rand(256, 1, generator=g)))
        self.u = self.a.cumsum(1) / POINTS
        if classes:
            self.u = (amplitude.squeeze(1) > 3).long()
        elif scaled_targets:
            self.u = self.u / self.u.std(1, keepdim=True)
        self.per_sample, self.stats = per_sample, (self.a.mean(), self.a.std())

    def __len__(self):
        return len(self.a)

    def __getitem__(self, i):
        a = self.a[i]
        mean, std = (a.mean(), a.std()) if self.per_sample else self.stats
        return torch.stack([(a - mean) / std, self.grid]), self.u[i]


def found(dataset: Fields) -> list:
    model = nn.Sequential(nn.Flatten(), nn.Linear(2 * POINTS, 2 if dataset.u.dim() == 1 else POINTS))
    loss = nn.CrossEntropyLoss() if dataset.u.dim() == 1 else nn.MSELoss()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(dataset, batch_size=64, shuffle=True),
                           loss_fn=loss, checks=[FirstBatchCheck(), SampleStandardisedCheck()])
    return report.check("data.sample_standardised").issues


def test_fields_standardised_per_sample_beside_solutions_that_scale_with_them_fire():
    issues = found(Fields(per_sample=True))
    assert [i.code for i in issues] == ["INPUTS_STANDARDISED_PER_SAMPLE"]
    assert "input channel(s) 0 of every sample" in issues[0].message and "own mean and std" in issues[0].message
    assert "computed once over the training set" in issues[0].fix


@pytest.mark.parametrize("dataset", [Fields(per_sample=False), Fields(per_sample=True, classes=True),
                                     Fields(per_sample=True, scaled_targets=True)],
                         ids=["training_set_statistics", "class_targets", "targets_of_one_scale"])
def test_quiet(dataset):
    assert not found(dataset)


def test_a_grid_channel_and_a_raw_channel_are_not_standardised():
    x = torch.stack([torch.randn(16, 10) * 5 + 2, torch.linspace(0, 1, 10).expand(16, 10)], 1)
    assert standardised_channels(x) == []
    rows = torch.randn(16, 10)
    assert standardised_channels((rows - rows.mean(1, keepdim=True)) / rows.std(1, keepdim=True)) == [0]


def chunk_targets(per_chunk: str):
    """Behaviour cloning of (K=8, A=2) action chunks from 6 observation features."""
    g = torch.Generator().manual_seed(3)
    obs = torch.randn(512, 6, generator=g)
    steps = torch.linspace(0, 1, 8)[None, :, None]
    chunks = obs[:, None, :2] * 3 + 5 + steps * obs[:, None, 2:4]
    if per_chunk == "minmax":
        low, high = chunks.amin(1, keepdim=True), chunks.amax(1, keepdim=True)
        chunks = 2 * (chunks - low) / (high - low) - 1
    elif per_chunk == "dataset":
        chunks = (chunks - chunks.mean(0)) / chunks.std(0)
    return torch.utils.data.TensorDataset(obs, chunks)


@pytest.mark.parametrize("per_chunk", ["minmax", "dataset"])
def test_targets_normalised_by_their_own_statistics(per_chunk):
    model = nn.Sequential(nn.Linear(6, 16), nn.Unflatten(1, (8, 2)))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(chunk_targets(per_chunk), batch_size=32), loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), SampleStandardisedCheck()])
    issues = report.check("data.sample_standardised").issues
    assert [i.code for i in issues] == (["TARGETS_NORMALISED_PER_SAMPLE"] if per_chunk == "minmax" else [])
    if issues:
        assert "min-max scaled to [-1, 1]" in issues[0].message and "train_targets.amin(0)" in issues[0].fix


def test_multi_hot_targets_span_zero_to_one_by_nature_and_stay_quiet():
    from optimus_preflight.preflight.checks.sample_standardised import targets_normalised_per_sample

    g = torch.Generator().manual_seed(4)
    tags = (torch.rand(64, 8, generator=g) < 0.3).float()
    tags[:, 0], tags[:, 1] = 1.0, 0.0  # every row holds both ends
    assert targets_normalised_per_sample(tags) is None
