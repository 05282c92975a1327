"""INIT_SCALE: a deep MLP initialised with a fixed std of 1 (activations explode) or 0.001 (they
vanish); the default init, He init, the same large init behind LayerNorm, and a single
zero-initialised head stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.init_scale import InitScaleCheck, gain
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from tests.preflight_support import assert_quiet, codes


def deep_mlp(init: str, normalised: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for index in range(6):
        layers += [nn.Linear(16 if index == 0 else 128, 128)] + ([nn.LayerNorm(128)] if normalised else []) + [nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(128, 3))
    for module in model:
        if isinstance(module, nn.Linear):
            if init == "std_1":
                nn.init.normal_(module.weight, 0, 1.0)
            elif init == "std_0.001":
                nn.init.normal_(module.weight, 0, 0.001)
            elif init == "he":
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
    if init == "zero_head":
        nn.init.zeros_(model[-1].weight)
    return model


def result(model: nn.Module):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 16, generator=g), torch.randint(0, 3, (256,), generator=g))
    report = run_preflight(model, torch.optim.SGD(model.parameters(), 0.01), DataLoader(data, batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), InitScaleCheck()])
    return report.check("model.init_scale")


@pytest.mark.parametrize("init, says", [("std_1", "multiplies"), ("std_0.001", "divides")])
def test_a_fixed_std_ignoring_fan_in_fires(init, says):
    found = result(deep_mlp(init))
    assert codes(found) == {"INIT_SCALE"}
    assert says in found.issues[0].message and "kaiming_normal_" in found.issues[0].fix


@pytest.mark.parametrize("init, normalised", [("default", False), ("he", False), ("std_1", True), ("zero_head", False)])
def test_fan_in_inits_normalised_blocks_and_a_zero_head_are_quiet(init, normalised):
    assert_quiet(result(deep_mlp(init, normalised)))


def test_gain_is_std_times_root_fan_in():
    layer = nn.Linear(256, 64)
    nn.init.normal_(layer.weight, 0, 1.0)
    assert gain(layer) == pytest.approx(16.0, rel=0.05)
    assert gain(nn.Linear(256, 64)) == pytest.approx(1 / 3**0.5, rel=0.1)  # PyTorch's default (kaiming_uniform, a=5^0.5)
