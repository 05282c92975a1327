"""GENERATED_RANGE_MISMATCH: a GAN whose discriminator reads real samples that were never scaled
into the tanh generator's [-1, 1] (raw values around 3): it separates them by range alone. The
same GAN on scaled data, and one without an output activation, stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck


class GAN(nn.Module):
    def __init__(self, activation: nn.Module):
        super().__init__()
        torch.manual_seed(0)
        self.G = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2), activation)
        self.D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))


def gan_loss(model, batch):
    real = batch[0]
    fake = model.G(torch.randn(len(real), 4, device=real.device))
    d_real, d_fake = model.D(real), model.D(fake.detach())
    d_loss = F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real)) + \
        F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
    frozen = {name: p.detach() for name, p in model.D.named_parameters()}  # G's term moves G only
    g_out = torch.func.functional_call(model.D, frozen, (fake,))
    return d_loss + F.binary_cross_entropy_with_logits(g_out, torch.ones_like(g_out))


@pytest.mark.parametrize("scale, activation, fires", [(1.0, nn.Tanh(), True), (0.2, nn.Tanh(), False),
                                                      (1.0, nn.Identity(), False)],
                         ids=["raw_data_beside_tanh", "scaled_data", "no_output_activation"])
def test_real_data_outside_the_generators_range(scale, activation, fires):
    g = torch.Generator().manual_seed(0)
    real = (torch.randn(512, 2, generator=g) * 0.5 + 3.0) * scale
    model = GAN(activation)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 2e-3, betas=(0.5, 0.999)),
                           DataLoader(TensorDataset(real), batch_size=64, shuffle=True), loss_fn=gan_loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    found = [i for i in report.check("step.loss_function").issues if i.code == "GENERATED_RANGE_MISMATCH"]
    assert bool(found) == fires
    if fires:
        assert "tanh" in found[0].message and "x / 127.5 - 1" in found[0].fix
