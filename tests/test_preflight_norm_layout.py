"""BATCHNORM_OVER_TIME: nn.BatchNorm1d(num_features=T) on a (B, T, F) sequence (an
embedding's or a batch_first GRU's output, a smooth sensor window from the batch) fires; the
transposed input, channels-first conv features and a TSMixer-style Linear along time stay quiet."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.norm_layout import NormLayoutCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

T, F = 24, 6


class Transposed(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


class SensorNet(nn.Module):
    """(B, T, F) windows -> a norm -> a GRU -> a head; ``layout`` places the norm."""

    def __init__(self, layout: str):
        super().__init__()
        torch.manual_seed(0)
        self.layout = layout
        self.norm = {"over_time": nn.BatchNorm1d(T), "over_features": Transposed(nn.BatchNorm1d(F))}.get(layout)
        self.gru = nn.GRU(F, 16, batch_first=True)
        self.after_gru = nn.BatchNorm1d(T) if layout == "after_gru" else None
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        if self.norm is not None:
            x = self.norm(x)
        h, _ = self.gru(x)
        if self.after_gru is not None:
            h = self.after_gru(h)
        return self.head(h[:, -1])


def windows():
    g = torch.Generator().manual_seed(0)
    t = torch.arange(T) / T
    phase = 2 * math.pi * torch.rand(512, 1, F, generator=g)
    x = torch.sin(2 * math.pi * t[None, :, None] * 2 + phase) + 0.05 * torch.randn(512, T, F, generator=g)
    return TensorDataset(x, torch.randint(0, 3, (512,), generator=g))


def found(model, data):
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), NormLayoutCheck()])
    result = report.check("step.norm_layout")
    assert result.status.value != "crashed", result.detail
    return [i for i in result.issues if i.code == "BATCHNORM_OVER_TIME"]


@pytest.mark.parametrize("layout, fires", [("over_time", True), ("after_gru", True), ("over_features", False),
                                           ("none", False)])
def test_a_batchnorm_over_the_time_steps_of_a_sequence_fires(layout, fires):
    issues = found(SensorNet(layout), windows())
    assert bool(issues) == fires
    if fires:
        assert f"num_features={T}" in issues[0].message and f"nn.BatchNorm1d({F if layout == 'over_time' else 16})" \
            in issues[0].fix


def test_an_embedding_normalised_over_its_positions_fires():
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed, self.norm, self.head = nn.Embedding(50, 8), nn.BatchNorm1d(12), nn.Linear(8, 2)

        def forward(self, ids):
            return self.head(self.norm(self.embed(ids)).mean(1))

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50, (256, 12), generator=g)
    (issue,) = found(Tagger(), TensorDataset(ids, torch.randint(0, 2, (256,), generator=g)))
    assert "Embedding 'embed'" in issue.message and "nn.LayerNorm(8)" in issue.fix


def test_channels_first_features_and_a_linear_along_time_are_quiet():
    class Mixer(nn.Module):  # TSMixer: (B, C, T) mixed along time by a Linear, then normalised per channel
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv, self.time_mix = nn.Conv1d(F, 8, 3, padding=1), nn.Linear(T, T)
            self.norm, self.head = nn.BatchNorm1d(8), nn.Linear(8, 3)

        def forward(self, x):
            h = self.time_mix(self.conv(x.transpose(1, 2)))
            return self.head(self.norm(h).mean(-1))

    assert not found(Mixer(), windows())
