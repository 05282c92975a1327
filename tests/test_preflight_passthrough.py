"""step.passthrough, OUTPUT_PASSES_INPUT: a coupling flow whose masks never alternate hands
coordinate 0 back untouched; alternating masks and a plain autoencoder stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.passthrough import PassthroughCheck, passed_columns


class Flow(nn.Module):
    def __init__(self, alternate: bool, dims: int = 4):
        super().__init__()
        torch.manual_seed(0)
        half = dims // 2
        self.masks = [torch.arange(dims) < half if not (alternate and i % 2) else torch.arange(dims) >= half
                      for i in range(4)]
        self.nets = nn.ModuleList(nn.Sequential(nn.Linear(dims, 32), nn.Tanh(), nn.Linear(32, 2 * dims))
                                  for _ in range(4))

    def forward(self, x):
        log_det = x.new_zeros(len(x))
        for mask, net in zip(self.masks, self.nets, strict=True):
            scale, shift = net(x * mask).chunk(2, -1)
            scale = torch.tanh(scale) * ~mask
            x = x * mask + ~mask * (x * scale.exp() + shift)
            log_det = log_det + scale.sum(-1)
        return x, log_det


def nll(model, batch):
    z, log_det = model(batch[0])
    return (0.5 * z.pow(2).sum(-1) - log_det).mean()


@pytest.mark.parametrize("alternate", [False, True])
def test_masks_that_never_alternate_pass_half_the_coordinates_through(alternate):
    data = TensorDataset(torch.randn(512, 4, generator=torch.Generator().manual_seed(0)))
    model = Flow(alternate)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=64),
                           loss_fn=nll, checks=[FirstBatchCheck(), PassthroughCheck()])
    issues = report.check("step.passthrough").issues
    assert [issue.code for issue in issues] == ([] if alternate else ["OUTPUT_PASSES_INPUT"])
    if issues:
        assert "input column(s) 0, 1 of its (64, 4) input" in issues[0].message and "1 - mask" in issues[0].fix


def test_only_some_columns_returned_exactly_count():
    x = torch.randn(16, 3)
    assert passed_columns(x, x.clone()) is None  # the identity: another check's
    assert passed_columns(x, x + 1) is None
    changed = x.clone()
    changed[:, 1:] += 1
    assert passed_columns(x, changed) == [0]
