"""CONV1D_TIME_AS_CHANNELS: (batch, time, features) windows into a Conv1d built with in_channels =
time; the transposed layout, channels-first ECG-like signals and a mel spectrogram stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.series import lag_one
from optimus_preflight.preflight.checks.conv_layout import ConvLayoutCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from tests.preflight_support import assert_quiet, codes


class Transposed(nn.Module):
    def __init__(self, conv: nn.Conv1d):
        super().__init__()
        self.conv, self.head = conv, nn.Linear(conv.out_channels, 2)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x.transpose(1, 2))).mean(-1))


def classifier(conv: nn.Conv1d) -> nn.Module:
    return nn.Sequential(conv, nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(conv.out_channels, 2))


def windows(samples: int, time: int, features: int, smooth: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(samples, time, features, generator=g)
    return torch.cumsum(noise, dim=1) / time**0.5 if smooth else noise


def result(model: nn.Module, x: torch.Tensor):
    torch.manual_seed(0)
    y = torch.randint(0, 2, (len(x),), generator=torch.Generator().manual_seed(1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), ConvLayoutCheck()])
    return report.check("step.conv_layout")


@pytest.mark.parametrize("smooth", [True, False], ids=["random_walk_sensors", "noisy_windows"])
def test_time_steps_read_as_channels_fire(smooth):
    found = result(classifier(nn.Conv1d(96, 16, 5, padding=2)), windows(128, 96, 8, smooth))
    assert codes(found) == {"CONV1D_TIME_AS_CHANNELS"}
    assert "x.transpose(1, 2)" in found.issues[0].fix and "in_channels=8" in found.issues[0].fix


def test_the_transposed_window_and_channels_first_signals_are_quiet():
    assert_quiet(result(Transposed(nn.Conv1d(8, 16, 5, padding=2)), windows(128, 96, 8, smooth=True)))
    leads = windows(128, 500, 12, smooth=True).transpose(1, 2).contiguous()  # (B, 12 leads, 500 samples)
    assert_quiet(result(classifier(nn.Conv1d(12, 16, 5, padding=2)), leads))
    mels = torch.rand(128, 64, 120, generator=torch.Generator().manual_seed(2))  # (B, 64 mel bins, 120 frames)
    assert_quiet(result(classifier(nn.Conv1d(64, 16, 3, padding=1)), mels))


def test_lag_one_reads_smoothness_along_an_axis():
    walk = windows(16, 64, 4, smooth=True)
    assert lag_one(walk, 1) > 0.8 and abs(lag_one(walk, 2)) < 0.5


class LastStep(nn.Module):
    def __init__(self, rnn: nn.RNNBase, transpose: bool = False):
        super().__init__()
        self.rnn, self.transpose, self.head = rnn, transpose, nn.Linear(rnn.hidden_size, 2)

    def forward(self, x):
        return self.head(self.rnn(x.transpose(1, 2) if self.transpose else x)[0][:, -1])


def test_an_rnn_stepping_over_the_channels_of_a_channels_first_window_fires():
    sensors = windows(128, 128, 6, smooth=True).transpose(1, 2).contiguous()  # (B, 6 sensors, 128 steps)
    found = result(LastStep(nn.LSTM(128, 16, batch_first=True)), sensors)
    assert codes(found) == {"RNN_TIME_AS_FEATURES"}
    assert "x.transpose(1, 2)" in found.issues[0].fix and "LSTM(input_size=6" in found.issues[0].fix


def test_rnns_over_time_and_short_sequences_of_wide_features_stay_quiet():
    sensors = windows(128, 128, 6, smooth=True).transpose(1, 2).contiguous()
    assert_quiet(result(LastStep(nn.GRU(6, 16, batch_first=True), transpose=True), sensors))
    frames = torch.randn(128, 8, 128, generator=torch.Generator().manual_seed(3))  # 8 steps of 128 unordered features
    assert_quiet(result(LastStep(nn.GRU(128, 16, batch_first=True)), frames))


class TextCnn(nn.Module):
    """Embeddings (B, T, E) into a Conv1d: permuted to (B, E, T), or handed over as they come
    with in_channels = T (the tokens as channels)."""

    def __init__(self, permuted: bool, tokens: int = 30, width: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.permuted = permuted
        self.embed = nn.Embedding(50, width)
        self.conv = nn.Conv1d(width if permuted else tokens, 32, 3, padding=1)
        self.head = nn.Linear(32, 2)

    def forward(self, ids):
        x = self.embed(ids)
        x = x.permute(0, 2, 1) if self.permuted else x
        return self.head(torch.relu(self.conv(x)).max(-1).values)


@pytest.mark.parametrize("permuted", [False, True])
def test_embeddings_handed_to_a_conv1d_built_with_the_sequence_length_as_channels(permuted):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (256, 30), generator=g)
    labels = (ids[:, :5] > 25).sum(1).gt(2).long()
    model = TextCnn(permuted)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids, labels), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), ConvLayoutCheck()])
    result = report.check("step.conv_layout")
    if permuted:
        assert_quiet(result)
        return
    assert codes(result) == {"CONV1D_TIME_AS_CHANNELS"}
    assert "output of the embedding 'embed'" in result.issues[0].message and "permute(0, 2, 1)" in result.issues[0].fix
