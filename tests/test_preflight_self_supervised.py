"""Findings on self-supervised, generative and distillation setups: each fires on the broken
setup and stays quiet on its corrected twin."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.contrastive_targets import ContrastiveTargetsCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.model_checks import OptimizerParamsCheck
from optimus_preflight.preflight.checks.module_structure import ModuleStructureCheck
from optimus_preflight.preflight.checks.split_scale import pixel_factor
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, GradientsCheck, LossFunctionCheck


def codes_of(report, check: str) -> list[str]:
    return [issue.code for issue in report.check(check).issues]


def signals(rows: int = 512) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(rows, 32, generator=g))


class Student(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("teacher_both_sides", [True, False])
def test_a_distillation_term_with_the_teacher_on_both_sides_is_constant(teacher_both_sides):
    torch.manual_seed(0)
    student, teacher = Student(), Student().requires_grad_(False)

    def kd(model, batch):
        (x,) = batch
        with torch.no_grad():
            t = teacher(x)
        source = t if teacher_both_sides else model(x)
        return F.kl_div(F.log_softmax(source / 2, -1), F.softmax(t / 2, -1), reduction="batchmean") \
            + 0.0 * model(x).sum()

    report = run_preflight(student, torch.optim.Adam(student.parameters(), 1e-3), DataLoader(signals(), batch_size=32),
                           loss_fn=kd, checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    issues = [i for i in report.check("step.loss_function").issues if i.code == "KL_TERM_CONSTANT"]
    assert bool(issues) == teacher_both_sides
    if issues:
        assert "the teacher's logits are on both sides" in issues[0].message


def two_views(rows: int = 512) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 16, generator=g)
    return TensorDataset(x)


@pytest.mark.parametrize("second_view", [False, True], ids=["z1_with_itself", "z1_with_z2"])
def test_info_nce_of_one_view_with_itself(second_view):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))

    def info_nce(model, batch):
        (x,) = batch
        z1 = F.normalize(model(x + 0.1 * torch.randn_like(x)), dim=1)
        z2 = F.normalize(model(x + 0.1 * torch.randn_like(x)), dim=1)
        logits = (z1 @ (z2 if second_view else z1).T) / 0.2
        return F.cross_entropy(logits, torch.arange(len(x), device=x.device))

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(two_views(), batch_size=64, shuffle=True), loss_fn=info_nce,
                           checks=[FirstBatchCheck(), ContrastiveTargetsCheck()])
    codes = codes_of(report, "step.contrastive_targets")
    assert codes == ([] if second_view else ["IN_BATCH_POSITIVE_IS_SELF"])
    if codes:
        assert "z1 @ z1.T" in report.check("step.contrastive_targets").issues[0].message


class Denoiser(nn.Module):
    def __init__(self, optimise_the_copy: bool):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        self.ema = copy.deepcopy(self.net).requires_grad_(False)

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("optimise_the_copy", [True, False])
def test_an_optimizer_built_over_the_ema_copy(optimise_the_copy):
    torch.manual_seed(0)
    model = Denoiser(optimise_the_copy)
    params = model.ema.parameters() if optimise_the_copy else model.net.parameters()
    report = run_preflight(model, torch.optim.Adam(params, 1e-3), DataLoader(signals(), batch_size=32),
                           loss_fn=lambda m, b: F.mse_loss(m(b[0] + 0.1), b[0]),
                           checks=[FirstBatchCheck(), OptimizerParamsCheck(), ModuleStructureCheck()])
    o2 = [i for i in report.check("model.optimizer_params").issues if i.code == "O2"]
    assert bool(o2) == optimise_the_copy
    if o2:
        assert "frozen copy of the network (a target network, an EMA" in o2[0].message and "'ema'" in o2[0].message
    # The EMA copy is a deepcopy of the trained net: frozen, at the default init, and no random features.
    assert "FROZEN_AT_INIT" not in codes_of(report, "model.structure")


class TraceVAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(64, 16)
        self.decoder = nn.Linear(8, 64)

    def forward(self, x):
        mu, logvar = self.encoder(x).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.decoder(z), mu, logvar


@pytest.mark.parametrize("reconstruction", ["mean", "sum"])
def test_a_whole_vae_loss_divided_by_a_constant_keeps_its_terms_apart(reconstruction):
    torch.manual_seed(0)
    model = TraceVAE()

    def vae_loss(model, batch):
        (x,) = batch
        recon, mu, logvar = model(x)
        rec = F.mse_loss(recon, x, reduction=reconstruction)
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return (rec + kl) / (x.shape[0] if reconstruction == "sum" else 1)

    data = TensorDataset(torch.randn(512, 64, generator=torch.Generator().manual_seed(2)))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=64),
                           loss_fn=vae_loss, checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    assert ("LOSS_REDUCTIONS_MIXED" in codes_of(report, "step.loss_function")) == (reconstruction == "mean")


def test_a_split_255_times_smaller_than_the_other_is_named():
    assert pixel_factor(0.0007, 0.18) == "training"
    assert pixel_factor(0.18, 0.0007) == "validation"
    assert pixel_factor(0.5, 0.18) is None and pixel_factor(0.0, 0.18) is None


class Seq2Seq(nn.Module):
    def __init__(self, pass_state: bool):
        super().__init__()
        self.pass_state = pass_state
        self.src_emb, self.tgt_emb = nn.Embedding(20, 16), nn.Embedding(20, 16)
        self.encoder, self.decoder = nn.GRU(16, 32, batch_first=True), nn.GRU(16, 32, batch_first=True)
        self.out = nn.Linear(32, 20)

    def forward(self, src, tgt_in):
        _, h = self.encoder(self.src_emb(src))
        out, _ = self.decoder(self.tgt_emb(tgt_in), h) if self.pass_state else self.decoder(self.tgt_emb(tgt_in))
        return self.out(out)


@pytest.mark.parametrize("pass_state", [False, True])
def test_a_decoder_that_never_gets_the_encoder_state(pass_state):
    g = torch.Generator().manual_seed(3)
    src = torch.randint(1, 20, (256, 8), generator=g)
    tgt = src.flip(1)
    model = Seq2Seq(pass_state)

    def loss_fn(model, batch):
        src, tgt = batch
        logits = model(src, torch.cat([torch.zeros_like(tgt[:, :1]), tgt[:, :-1]], 1))
        return F.cross_entropy(logits.reshape(-1, 20), tgt.reshape(-1))

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(src, tgt), batch_size=32), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), GradientsCheck()])
    issues = [i for i in report.check("step.gradients").issues if i.code == "GRAD_NONE"]
    assert bool(issues) == (not pass_state)
    if issues:
        assert "encoder's final hidden state is never passed to the decoder" in issues[0].message
        assert "self.decoder(tgt_in, h)" in issues[0].fix


class FlippedPairs(torch.utils.data.Dataset):
    """Noisy tiles and their clean targets under a random left-right flip: one coin toss for the
    pair, or one for each."""

    def __init__(self, shared_flip: bool):
        g = torch.Generator().manual_seed(4)
        ramp = torch.linspace(0, 1, 12)
        self.clean = (ramp[None, None, :] * torch.rand(256, 1, 1, generator=g) + 0.2 * torch.rand(256, 12, 12, generator=g))
        self.noise = 0.1 * torch.randn(256, 12, 12, generator=g)
        self.coins = torch.rand(256, 2, generator=g) < 0.5
        self.shared_flip = shared_flip

    def __len__(self):
        return len(self.clean)

    def __getitem__(self, i):
        clean, noisy = self.clean[i][None], (self.clean[i] + self.noise[i])[None]
        flip_in, flip_out = self.coins[i, 0], self.coins[i, 0] if self.shared_flip else self.coins[i, 1]
        return (noisy.flip(-1) if flip_in else noisy), (clean.flip(-1) if flip_out else clean)


@pytest.mark.parametrize("shared_flip", [False, True])
def test_a_denoiser_whose_input_and_target_flip_on_separate_coins(shared_flip):
    from optimus_preflight.preflight.checks.mask_alignment import MaskAlignmentCheck

    model = nn.Conv2d(1, 1, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(FlippedPairs(shared_flip), batch_size=32), loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), MaskAlignmentCheck()])
    issues = report.check("data.mask_alignment").issues
    assert [i.code for i in issues] == ([] if shared_flip else ["MASK_MISALIGNED"])
    if issues:
        assert "separate random draws" in issues[0].message and "flipped left-right" in issues[0].message


def test_identical_stacked_views_are_named_as_identical_not_as_a_self_product():
    # NT-Xent over z = cat([z1, z2]) is z @ z.T by design (partner targets, diagonal masked): with
    # the two views one tensor, the finding is the views, not the product.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))

    def nt_xent_same_view(model, batch):
        (x,) = batch
        n = len(x)
        z = F.normalize(model(torch.cat([x, x])), dim=1)
        logits = (z @ z.T / 0.2).masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
        return F.cross_entropy(logits, (torch.arange(2 * n) + n) % (2 * n))

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(two_views(), batch_size=64, shuffle=True), loss_fn=nt_xent_same_view,
                           checks=[FirstBatchCheck(), ContrastiveTargetsCheck()])
    assert codes_of(report, "step.contrastive_targets") == ["IN_BATCH_VIEWS_IDENTICAL"]
