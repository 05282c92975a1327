"""step.flow_likelihood: an affine-coupling flow whose NLL detaches or subtracts the
log-determinant, scores the data instead of the latent, or weights the base term by the batch
size or 1/D fires its code; the correct NLL, a volume-preserving flow whose loss leaves its
constant log-determinant out, a logistic base and a (reconstruction, per-sample value) model
that is no flow stay quiet."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.flow_likelihood import FlowLikelihoodCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

DIMS = 4


class Coupling(nn.Module):
    def __init__(self, flip: bool, additive: bool):
        super().__init__()
        self.flip, self.additive = flip, additive
        self.net = nn.Sequential(nn.Linear(DIMS // 2, 16), nn.Tanh(), nn.Linear(16, DIMS))

    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        if self.flip:
            a, b = b, a
        s, t = self.net(a).chunk(2, dim=1)
        s = torch.zeros_like(s) if self.additive else torch.tanh(s)
        b = b * torch.exp(s) + t
        out = torch.cat([b, a] if self.flip else [a, b], dim=1)
        return out, s.sum(1)


class Flow(nn.Module):
    def __init__(self, additive: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(Coupling(i % 2 == 1, additive) for i in range(4))

    def forward(self, x):
        logdet = torch.zeros(len(x))
        for layer in self.layers:
            x, ld = layer(x)
            logdet = logdet + ld
        return x, logdet


class AutoencoderWithScore(nn.Module):
    """Returns a reconstruction and a per-sample score that is no log-determinant."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIMS, 8), nn.Tanh(), nn.Linear(8, DIMS))

    def forward(self, x):
        out = self.net(x)
        return out, out.pow(2).sum(1)


def normal_logp(z):
    return (-0.5 * z ** 2 - 0.5 * math.log(2 * math.pi)).sum(1)


def logistic_logp(z):
    return -(nn.functional.softplus(z) + nn.functional.softplus(-z)).sum(1)


LOSSES = {
    "correct": (lambda m, b: -(normal_logp(m(b[0])[0]) + m(b[0])[1]).mean(), []),
    "logistic_base": (lambda m, b: -(logistic_logp(m(b[0])[0]) + m(b[0])[1]).mean(), []),
    "detached": (lambda m, b: -(normal_logp(m(b[0])[0]) + m(b[0])[1].detach()).mean(), ["FLOW_LOGDET_DETACHED"]),
    "subtracted": (lambda m, b: -(normal_logp(m(b[0])[0]) - m(b[0])[1]).mean(), ["FLOW_LOGDET_SIGN"]),
    "base_of_data": (lambda m, b: -(normal_logp(b[0]) + m(b[0])[1]).mean(), ["FLOW_BASE_OFF_LATENT"]),
    "base_summed_over_batch": (lambda m, b: -(normal_logp(m(b[0])[0]).sum() + m(b[0])[1]).mean(),
                               ["FLOW_TERMS_WEIGHTED_APART"]),
    "base_per_dimension": (lambda m, b: -(torch.distributions.Normal(0.0, 1.0).log_prob(m(b[0])[0])
                                          + m(b[0])[1].unsqueeze(-1)).mean(), ["FLOW_TERMS_WEIGHTED_APART"]),
}


def preflight(model, loss_fn):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, DIMS, generator=g) @ torch.randn(DIMS, DIMS, generator=g)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x), batch_size=32, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), FlowLikelihoodCheck()])
    assert report.check("step.first_step").status.value == "passed"
    return report.check("step.flow_likelihood")


@pytest.mark.parametrize("name", list(LOSSES))
def test_each_way_of_wiring_a_flow_nll(name):
    loss_fn, expected = LOSSES[name]
    torch.manual_seed(0)
    result = preflight(Flow(), loss_fn)
    assert result.data["summary"] == "a flow: the NLL's two terms read"
    assert [i.code for i in result.issues] == expected, [i.message for i in result.issues]
    if name == "base_summed_over_batch":
        assert "32 times (the batch size, 32)" in result.issues[0].message
        assert ".sum(-1)" in result.issues[0].fix
    if name == "base_per_dimension":
        assert f"1/{DIMS}" in result.issues[0].message


def test_a_volume_preserving_flow_may_leave_its_constant_log_determinant_out():
    torch.manual_seed(0)
    result = preflight(Flow(additive=True), lambda m, b: -normal_logp(m(b[0])[0]).mean())
    assert result.issues == [] and result.data["summary"] == "a flow: the NLL's two terms read"


def test_a_per_sample_output_that_is_no_log_determinant_is_no_flow():
    torch.manual_seed(0)
    result = preflight(AutoencoderWithScore(), lambda m, b: (m(b[0])[0] - b[0]).pow(2).mean() - m(b[0])[1].mean())
    assert result.issues == [] and "not a flow" in result.data["summary"]
