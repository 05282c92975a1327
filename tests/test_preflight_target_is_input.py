"""TARGET_IS_INPUT: a denoiser whose loss compares its output with the noisy input instead of
the batch's clean signal; the correct denoiser and a plain autoencoder stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, TargetsCheck

g = torch.Generator().manual_seed(0)
CLEAN = torch.sin(torch.linspace(0, 20, 64))[None].repeat(256, 1) * torch.rand(256, 1, generator=g)
NOISY = CLEAN + 0.3 * torch.randn(256, 64, generator=g)


def issues(loss_fn, dataset) -> list:
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 64))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(dataset, batch_size=32, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    return [i for i in report.check("step.targets").issues if i.code == "TARGET_IS_INPUT"]


@pytest.mark.parametrize("name, loss_fn, dataset, fires", [
    ("towards_noisy_input", lambda m, b: nn.functional.mse_loss(m(b[0]), b[0]), TensorDataset(NOISY, CLEAN), True),
    ("towards_clean", lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]), TensorDataset(NOISY, CLEAN), False),
    ("autoencoder", lambda m, b: nn.functional.mse_loss(m(b[0]), b[0]), TensorDataset(CLEAN), False),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_target_that_is_the_models_own_input(name, loss_fn, dataset, fires):
    assert bool(issues(loss_fn, dataset)) == fires


def noised(predict: str):
    def loss_fn(model, batch):
        x0 = batch[0]
        noise = torch.randn_like(x0)
        x_t = 0.6 * x0 + 0.8 * noise
        return nn.functional.mse_loss(model(x_t), x_t if predict == "x_t" else noise)
    return loss_fn


@pytest.mark.parametrize("predict", ["x_t", "noise"])
def test_a_diffusion_loss_regressing_its_noised_input_is_named(predict):
    found = issues(noised(predict), TensorDataset(CLEAN))
    assert bool(found) == (predict == "x_t")
    if found:
        assert "noised x_t" in found[0].message and "mse_loss(model(x_t, t), noise)" in found[0].fix
    assert "x_t" not in (issues(lambda m, b: nn.functional.mse_loss(m(b[0]), b[0]), TensorDataset(NOISY, CLEAN))[0].message)


@pytest.mark.parametrize("cumulative", [False, True], ids=["per_step_alphas", "cumprod"])
def test_a_forward_process_that_never_reaches_high_noise(cumulative):
    betas = torch.linspace(1e-4, 0.02, 1000)
    alpha_bar = torch.cumprod(1 - betas, 0) if cumulative else 1 - betas

    def ddpm(model, batch):
        x0 = batch[0]
        t = torch.randint(0, 1000, (len(x0),))
        noise = torch.randn_like(x0)
        a = alpha_bar[t].view(-1, 1)
        return nn.functional.mse_loss(model(a.sqrt() * x0 + (1 - a).sqrt() * noise), noise)

    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 64))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(CLEAN), batch_size=32, shuffle=True), loss_fn=ddpm,
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    found = [i for i in report.check("step.targets").issues if i.code == "DIFFUSION_NOISE_NEVER_HIGH"]
    assert bool(found) == (not cumulative)
    if found:
        assert "torch.cumprod(1 - betas, dim=0)" in found[0].fix


class Seq2SeqForecaster(nn.Module):
    """A GRU encoder over the window, a GRU decoder over the teacher-forced inputs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.enc, self.dec, self.out = nn.GRU(1, 16, batch_first=True), nn.GRU(1, 16, batch_first=True), nn.Linear(16, 1)

    def forward(self, window, decoder_inputs):
        _, h = self.enc(window.unsqueeze(-1))
        out, _ = self.dec(decoder_inputs.unsqueeze(-1), h)
        return self.out(out).squeeze(-1)


@pytest.mark.parametrize("shifted", [False, True])
def test_a_decoder_given_its_own_target_without_the_shift(shifted):
    series = torch.sin(torch.arange(3000.0) / 9).unfold(0, 32, 4)
    window, future = series[:, :24], series[:, 24:]
    decoder_inputs = torch.cat([window[:, -1:], future[:, :-1]], 1) if shifted else future.clone()

    def teacher_forced(model, batch):
        return nn.functional.mse_loss(model(batch[0], batch[1]), batch[2])

    model = Seq2SeqForecaster()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(window, decoder_inputs, future), batch_size=32, shuffle=True),
                           loss_fn=teacher_forced, checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    found = [i for i in report.check("step.targets").issues if i.code == "TARGET_IS_INPUT"]
    assert bool(found) == (not shifted)
    if found:
        assert "teacher forcing without the shift" in found[0].message and "y[:, :-1]" in found[0].fix
