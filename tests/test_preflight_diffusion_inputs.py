"""step.diffusion_inputs: a noise-prediction DDPM step whose x_t is pure noise at every timestep
(alphas_cumprod from the betas themselves), whose data is far from unit scale, or whose target
is a second noise draw; the same step written right stays quiet, in 2-d points and in images."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.diffusion_inputs import DiffusionInputsCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

STEPS = 100


class Denoiser(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(dim + 1, 64), nn.SiLU(), nn.Linear(64, dim))

    def forward(self, x_t, t):
        flat = x_t.flatten(1)
        return self.net(torch.cat([flat, t.float().unsqueeze(1) / STEPS], 1)).view_as(x_t)


def ddpm_loss(schedule: str = "cumprod(1 - betas)", target: str = "same noise"):
    def loss(model, batch):
        x0 = batch[0]
        betas = torch.linspace(1e-4, 0.05, STEPS, device=x0.device)
        alpha_bar = torch.cumprod(betas if schedule == "cumprod(betas)" else 1 - betas, 0)
        t = torch.randint(0, STEPS, (len(x0),), device=x0.device)
        a = alpha_bar[t].view(-1, *[1] * (x0.dim() - 1))
        noise = torch.randn_like(x0)
        x_t = a.sqrt() * x0 + (1 - a).sqrt() * noise
        wanted = torch.randn_like(x0) if target == "second draw" else noise
        return F.mse_loss(model(x_t, t), wanted)
    return loss


def points(scale: float = 1.0) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    angle = 2 * math.pi * torch.rand(2048, generator=g)
    x = torch.stack([angle.cos(), angle.sin()], 1) + 0.05 * torch.randn(2048, 2, generator=g)
    return TensorDataset(x * scale)


def images() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.rand(512, 1, 8, 8, generator=g) * 2 - 1)  # in [-1, 1], as DDPM wants


def issues(data: TensorDataset, loss_fn) -> dict:
    dim = math.prod(data.tensors[0].shape[1:])
    model = Denoiser(dim)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(data, batch_size=128, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), DiffusionInputsCheck()])
    return {issue.code: issue for issue in report.check("step.diffusion_inputs").issues}


@pytest.mark.parametrize("data", [points, images], ids=["points", "images"])
def test_a_right_ddpm_step_is_quiet(data):
    assert issues(data(), ddpm_loss()) == {}


def test_alpha_bar_from_the_betas_makes_every_sample_pure_noise():
    issue = issues(points(), ddpm_loss(schedule="cumprod(betas)"))["DIFFUSION_NOISE_NEVER_LOW"]
    assert "pure noise" in issue.message and "torch.cumprod(1 - betas, dim=0)" in issue.fix


@pytest.mark.parametrize("scale", [50.0, 0.01])
def test_data_far_from_unit_scale_is_named(scale):
    issue = issues(points(scale), ddpm_loss())["DIFFUSION_DATA_SCALE"]
    assert f"std of {0.707 * scale:.2g}"[:9] in issue.message and "[-1, 1]" in issue.fix


@pytest.mark.parametrize("data", [points, images], ids=["points", "images"])
def test_a_target_drawn_a_second_time_is_named(data):
    issue = issues(data(), ddpm_loss(target="second draw"))["DIFFUSION_TARGET_NOT_IN_INPUT"]
    assert "second draw" in issue.message and "Draw the noise once" in issue.fix
