"""FFT_OVER_CHANNELS (``analyses/spectral_axis.py``, reported by ``step.batch_layout``): a
spectral transform taken along a short axis (the channels) of windows that have a long time
axis, ``torch.fft.rfft(x)`` on ``(B, T, C)``; rfft along the time axis and the default dim
of ``(B, C, T)`` windows stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.spectral_axis import fft_over_channels
from optimus_preflight.preflight.checks.batch_layout import BatchLayoutCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck

STEPS, CHANNELS, CLASSES = 64, 3, 4


class SpectralClassifier(nn.Module):
    """Magnitude spectrum of each window, then a linear head."""

    def __init__(self, spectrum, features):
        super().__init__()
        self.spectrum = spectrum
        self.head = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, CLASSES))

    def forward(self, x):
        return self.head(self.spectrum(x).abs().flatten(1))


def _windows(channels_first=False):
    torch.manual_seed(0)
    x = torch.randn(128, STEPS, CHANNELS)  # (B, T, C) sensor windows
    if channels_first:
        x = x.transpose(1, 2).contiguous()  # (B, C, T)
    return DataLoader(TensorDataset(x, torch.randint(0, CLASSES, (128,))), batch_size=16, shuffle=True)


HALF = STEPS // 2 + 1
SPECTRA = {
    # (B, T, C) windows
    "rfft_default_dim": (lambda x: torch.fft.rfft(x), (CHANNELS // 2 + 1) * STEPS, False, True),
    "fft_default_dim": (lambda x: torch.fft.fft(x), CHANNELS * STEPS, False, True),
    "rfftn_last_dim": (lambda x: torch.fft.rfftn(x, dim=(-1,)), (CHANNELS // 2 + 1) * STEPS, False, True),
    "rfft_along_time": (lambda x: torch.fft.rfft(x, dim=1), HALF * CHANNELS, False, False),
    "rfft2_over_both": (lambda x: torch.fft.rfft2(x), STEPS * (CHANNELS // 2 + 1), False, False),
    # (B, C, T) windows
    "channels_first_default_dim": (lambda x: torch.fft.rfft(x), CHANNELS * HALF, True, False),
}


@pytest.mark.parametrize("spectrum", sorted(SPECTRA))
def test_fft_across_the_channels_warns_and_along_time_stays_quiet(spectrum):
    function, features, channels_first, fires = SPECTRA[spectrum]
    torch.manual_seed(0)
    model = SpectralClassifier(function, features)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), _windows(channels_first),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), BatchLayoutCheck()])
    issues = [i for i in report.check("step.batch_layout").issues if i.code == "FFT_OVER_CHANNELS"]
    assert len(issues) == int(fires), report.check("step.batch_layout").issues
    if fires:
        assert issues[0].severity.value == "warning"
        assert "dim 2" in issues[0].message and f"only {CHANNELS}" in issues[0].message
        assert f"{STEPS} steps" in issues[0].message and "dim 1" in issues[0].message
        assert "dim=1)" in issues[0].fix and "(B, C, T)" in issues[0].fix


def test_the_transform_reads_its_dim_positionally_and_by_keyword():
    x = torch.randn(4, 100, 6)
    found = fft_over_channels("fft_rfft", (x, None, -1), {})
    assert found is not None and (found.dim, found.long_dim, found.function) == (2, 1, "torch.fft.rfft")
    assert fft_over_channels("fft_rfft", (x,), {"dim": 1}) is None
    assert fft_over_channels("fft_fftn", (x,), {}) is None  # every dim, not one
    assert fft_over_channels("fft_rfft", (torch.randn(4, 16, 6),), {}) is None  # no long axis
