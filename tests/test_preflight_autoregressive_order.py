"""step.autoregressive_order: a MADE whose output mask uses >= (output d reads input d) fires
AUTOREGRESSIVE_SEES_ITSELF; the strict mask and a plain (dense) autoencoder stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.autoregressive_order import AutoregressiveOrderCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

DIMS, HIDDEN = 12, 48


class MaskedLinear(nn.Linear):
    def __init__(self, features_in: int, features_out: int, mask: torch.Tensor):
        super().__init__(features_in, features_out)
        self.register_buffer("mask", mask.float())

    def forward(self, x):
        return F.linear(x, self.weight * self.mask, self.bias)


class Made(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        degree_in = torch.arange(1, DIMS + 1)
        degree_hidden = torch.randint(1, DIMS, (HIDDEN,), generator=g)
        if kind == "dense":
            self.net = nn.Sequential(nn.Linear(DIMS, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, DIMS))
            return
        out_mask = degree_in[:, None] > degree_hidden[None, :] if kind == "strict" else \
            degree_in[:, None] >= degree_hidden[None, :]
        self.net = nn.Sequential(MaskedLinear(DIMS, HIDDEN, degree_hidden[:, None] >= degree_in[None, :]), nn.ReLU(),
                                 MaskedLinear(HIDDEN, DIMS, out_mask))

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("kind", ["non_strict", "strict", "dense"])
def test_an_autoregressive_output_that_reads_its_own_input(kind):
    x = (torch.rand(256, DIMS, generator=torch.Generator().manual_seed(1)) < 0.4).float()
    model = Made(kind)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x), batch_size=32, shuffle=True),
                           loss_fn=lambda m, b: F.binary_cross_entropy_with_logits(m(b[0]), b[0]),
                           checks=[FirstBatchCheck(), FirstStepCheck(), AutoregressiveOrderCheck()])
    result = report.check("step.autoregressive_order")
    assert [i.code for i in result.issues] == (["AUTOREGRESSIVE_SEES_ITSELF"] if kind == "non_strict" else []), \
        result.data
    if result.issues:
        assert "m_in[:, None] > m_hidden[None, :]" in result.issues[0].fix
