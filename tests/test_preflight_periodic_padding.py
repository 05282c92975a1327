"""data.periodic_padding: a convolutional surrogate over periodic fields with zero padding fires
PERIODIC_FIELD_ZERO_PADDED; circular padding, and non-periodic signals (a random walk, whose ends
are unrelated), stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.periodic_padding import PeriodicPaddingCheck


def periodic_fields(n: int, points: int = 64) -> torch.Tensor:
    """Random fields of the first three Fourier modes on a ring of ``points``."""
    g = torch.Generator().manual_seed(0)
    angle = torch.arange(points) * 2 * torch.pi / points
    modes = torch.randn(n, 3, 2, generator=g)
    return sum(modes[:, k, 0:1] * torch.cos((k + 1) * angle) + modes[:, k, 1:2] * torch.sin((k + 1) * angle)
               for k in range(3)).unsqueeze(1)


def random_walks(n: int, points: int = 64) -> torch.Tensor:
    return torch.randn(n, 1, points, generator=torch.Generator().manual_seed(0)).cumsum(-1)


@pytest.mark.parametrize("fields, mode, fires", [(periodic_fields, "zeros", True), (periodic_fields, "circular", False),
                                                 (random_walks, "zeros", False)],
                         ids=["periodic_zeros", "periodic_circular", "walks_zeros"])
def test_periodic_fields_convolved_with_zero_padding(fields, mode, fires):
    a = fields(256)
    u = a ** 2 + torch.roll(a, 1, -1) - 2 * a + torch.roll(a, -1, -1)
    model = nn.Sequential(nn.Conv1d(1, 8, 5, padding=2, padding_mode=mode), nn.GELU(),
                          nn.Conv1d(8, 1, 5, padding=2, padding_mode=mode))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(a, u), batch_size=32, shuffle=True), loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), PeriodicPaddingCheck()])
    issues = report.check("data.periodic_padding").issues
    assert [i.code for i in issues] == (["PERIODIC_FIELD_ZERO_PADDED"] if fires else [])
    if issues:
        assert "padding_mode='circular'" in issues[0].fix and "periodic along dim 2" in issues[0].message
