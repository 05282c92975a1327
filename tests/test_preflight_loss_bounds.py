"""step.loss_bounds: LOSS_UNBOUNDED_BELOW, a loss the model can lower forever by moving its
predictions (a pinball loss with its quantile in percent); quiet on bounded losses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.loss_bounds import LossBoundsCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck


def pinball(q: float):
    def loss_fn(model, batch):
        x, y = batch
        error = y - model(x).squeeze(-1)
        return torch.maximum(q * error, (q - 1) * error).mean()
    return loss_fn


def gaussian_nll(model, batch):
    x, y = batch
    mean, log_var = model(x).unbind(-1)
    return F.gaussian_nll_loss(mean, y, log_var.exp())


def unbounded(loss_fn, outputs: int = 1, classes: bool = False):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g)
    y = torch.randint(0, outputs, (256,), generator=g) if classes else x[:, 0] * 3 + 20
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, outputs))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), LossBoundsCheck()])
    return report.check("step.loss_bounds").issues


def test_a_pinball_loss_with_its_quantile_in_percent_has_no_minimum():
    found = unbounded(pinball(90))
    assert [issue.code for issue in found] == ["LOSS_UNBOUNDED_BELOW"]
    assert "moving every prediction up" in found[0].message and "q=0.9" in found[0].fix


@pytest.mark.parametrize("loss_fn, outputs, classes", [
    (pinball(0.9), 1, False),
    (lambda model, batch: F.mse_loss(model(batch[0]).squeeze(-1), batch[1]), 1, False),
    (gaussian_nll, 2, False),
    (nn.CrossEntropyLoss(), 4, True),
], ids=["pinball_fraction", "mse", "gaussian_nll", "cross_entropy"])
def test_bounded_losses_are_quiet(loss_fn, outputs, classes):
    assert unbounded(loss_fn, outputs, classes) == []


class Coupling(nn.Module):
    """A two-coordinate affine coupling flow: returns (z, log|det J|) per sample."""

    def __init__(self, flips: bool):
        super().__init__()
        torch.manual_seed(0)
        self.flips = flips
        self.nets = nn.ModuleList(nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 2)) for _ in range(4))

    def forward(self, x):
        log_det = x.new_zeros(len(x))
        for layer, net in enumerate(self.nets):
            keep, move = (x[:, :1], x[:, 1:]) if not (self.flips and layer % 2) else (x[:, 1:], x[:, :1])
            log_scale, shift = net(keep).chunk(2, -1)
            log_scale = torch.tanh(log_scale)
            moved = move * log_scale.exp() + shift
            x = torch.cat([keep, moved], 1) if not (self.flips and layer % 2) else torch.cat([moved, keep], 1)
            log_det = log_det + log_scale.squeeze(-1)
        return x, log_det


def flow_nll(model, batch):
    z, log_det = model(batch[0])
    return (0.5 * z.pow(2).sum(1) - log_det).mean()


def wrong_sign_kl_with_a_per_sample_term(model, batch):
    """Two outputs, one a per-sample scalar entering linearly: the wrong sign is on the other."""
    z, log_det = model(batch[0])
    return (-0.5 * z.pow(2).sum(1) - log_det).mean()


@pytest.mark.parametrize("loss_fn, fires", [(flow_nll, False), (wrong_sign_kl_with_a_per_sample_term, True)],
                         ids=["flow_log_determinant", "a_term_falling_with_every_output"])
def test_a_flows_log_determinant_alone_is_no_unbounded_loss(loss_fn, fires):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 2, generator=g) * torch.tensor([1.0, 0.3]) + torch.tensor([0.0, 2.0])
    model = Coupling(flips=True)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x), batch_size=32, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), LossBoundsCheck()])
    assert [issue.code for issue in report.check("step.loss_bounds").issues] == (["LOSS_UNBOUNDED_BELOW"] if fires else [])


@pytest.mark.parametrize("column_target", [False, True])
def test_gaussian_nll_with_a_vector_target_broadcasts(column_target):
    def loss_fn(model, batch):
        x, y = batch
        mean, log_var = model(x).chunk(2, dim=-1)  # (N, 1) each
        return F.gaussian_nll_loss(mean, y[:, None] if column_target else y, log_var.exp())

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g)
    model = nn.Linear(6, 2)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, x[:, 0] * 2), batch_size=32), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    found = [i for i in report.check("step.loss_function").issues if i.code == "LOSS_BROADCAST"]
    assert bool(found) == (not column_target)
    if found:
        assert "gaussian_nll_loss (nn.GaussianNLLLoss) gets a prediction of shape (32, 1) and a target of shape (32,)" in found[0].message


def focal(negate: bool, gamma: float = 2.0):
    def loss_fn(model, batch):
        x, y = batch
        log_p = F.log_softmax(model(x), -1).gather(1, y[:, None]).squeeze(1)
        term = (1 - log_p.exp()) ** gamma * log_p
        return (-term if negate else term).mean()
    return loss_fn


@pytest.mark.parametrize("loss_fn, fires", [(focal(negate=False), True), (focal(negate=True), False),
                                            (nn.CrossEntropyLoss(label_smoothing=0.1), False),
                                            (nn.MultiMarginLoss(), False)])
def test_a_loss_lowest_for_wrong_predictions_is_named(loss_fn, fires):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, 6, generator=g)
    y = x[:, :4].argmax(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), LossBoundsCheck()])
    found = [i for i in report.check("step.loss_bounds").issues if i.code == "LOSS_REWARDS_MISTAKES"]
    assert len(found) == int(fires)
    if fires:
        assert "minus sign" in found[0].message and "0% of the batch right" in found[0].message
        before = [p.detach().clone() for p in model.parameters()]
        assert all(p.grad is None for p in model.parameters())  # the descent never touched the model
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


class TwoTasks(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.regress, self.classify = nn.Linear(16, 1), nn.Linear(16, 3)
        self.log_vars = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        h = self.body(x)
        return self.regress(h).squeeze(-1), self.classify(h)


@pytest.mark.parametrize("with_log_term", [False, True], ids=["weights_only", "kendall"])
def test_learned_task_weights_that_can_scale_the_loss_away_fire(with_log_term):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g)
    data = TensorDataset(x, x[:, 0] * 2, (x[:, 1] > 0).long() + (x[:, 2] > 0).long())

    def weighted(model, batch):
        inputs, value, label = batch
        regression, logits = model(inputs)
        losses = torch.stack([F.mse_loss(regression, value), F.cross_entropy(logits, label)])
        total = (torch.exp(-model.log_vars) * losses).sum()
        return total + model.log_vars.sum() if with_log_term else total

    model = TwoTasks()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=32),
                           loss_fn=weighted, checks=[FirstBatchCheck(), LossBoundsCheck()])
    codes = [issue.code for issue in report.check("step.loss_bounds").issues]
    assert codes == ([] if with_log_term else ["LOSS_WEIGHT_VANISHES"])


class SigmoidVAE(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder, self.decoder = nn.Linear(12, 8), nn.Sequential(nn.Linear(4, 12), nn.Sigmoid())

    def forward(self, x):
        mu, logvar = self.encoder(x).chunk(2, dim=-1)
        return self.decoder(mu), mu, logvar


def test_a_kl_subtracted_beside_a_bce_on_probabilities_has_no_minimum():
    # Shifting the probabilities past 1 makes binary_cross_entropy raise: the other outputs still count.
    x = torch.rand(256, 12, generator=torch.Generator().manual_seed(0))

    def elbo_wrong_sign(model, batch):
        recon, mu, logvar = model(batch[0])
        kl = -0.5 * torch.sum(1 + logvar - mu ** 2 - logvar.exp()) / len(mu)
        return F.binary_cross_entropy(recon, batch[0], reduction="sum") / len(mu) - kl

    model = SigmoidVAE()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(TensorDataset(x), batch_size=32),
                           loss_fn=elbo_wrong_sign, checks=[FirstBatchCheck(), LossBoundsCheck()])
    assert [issue.code for issue in report.check("step.loss_bounds").issues] == ["LOSS_UNBOUNDED_BELOW"]


def test_an_output_bias_on_a_batch_of_one_class_is_no_vanishing_weight():
    # A rare-positive classifier's first batch may hold no positive: its output bias then drives the BCE
    # towards 0, which no loss weighting does.
    x = torch.randn(256, 6, generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, torch.zeros(256, 1)), batch_size=32),
                           loss_fn=nn.BCEWithLogitsLoss(), checks=[FirstBatchCheck(), LossBoundsCheck()])
    assert not report.check("step.loss_bounds").issues


class ActNormFlow(nn.Module):
    """z = (x - shift) * exp(log_scale): an elementwise affine flow with learned log-scales."""

    def __init__(self):
        super().__init__()
        self.shift, self.log_scale = nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(4))

    def forward(self, x):
        return (x - self.shift) * self.log_scale.exp(), self.log_scale.sum().expand(len(x))


@pytest.mark.parametrize("log_det_sign, fires", [(+1, False), (-1, True)], ids=["added", "subtracted"])
def test_a_flow_whose_log_determinant_is_subtracted_is_named(log_det_sign, fires):
    x = torch.randn(256, 4, generator=torch.Generator().manual_seed(0)) * 2 + 1

    def nll(model, batch):
        z, log_det = model(batch[0])
        log_pz = torch.distributions.Normal(0.0, 1.0).log_prob(z).sum(-1)
        return -(log_pz + log_det_sign * log_det).mean()

    model = ActNormFlow()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x), batch_size=32, shuffle=True), loss_fn=nll,
                           checks=[FirstBatchCheck(), LossBoundsCheck()])
    found = [issue for issue in report.check("step.loss_bounds").issues if issue.code == "LOSS_UNBOUNDED_BELOW"]
    assert bool(found) == fires
    if fires:
        assert "log_scale" in found[0].message and "log-determinant subtracted" in found[0].message
        assert "add the log-determinant" in found[0].fix


def si_snr(estimate: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    estimate, target = estimate - estimate.mean(-1, keepdim=True), target - target.mean(-1, keepdim=True)
    projection = (estimate * target).sum(-1, keepdim=True) / target.pow(2).sum(-1, keepdim=True).clamp_min(1e-8) * target
    noise = estimate - projection
    return 10 * torch.log10(projection.pow(2).sum(-1).clamp_min(1e-8) / noise.pow(2).sum(-1).clamp_min(1e-8))


@pytest.mark.parametrize("negated, fires", [(True, False), (False, True)], ids=["minus_si_snr", "si_snr_as_loss"])
def test_a_similarity_returned_as_the_loss_without_its_minus(negated, fires):
    g = torch.Generator().manual_seed(0)
    clean = torch.sin(torch.linspace(0, 40, 256)[None] * (1 + torch.rand(128, 1, generator=g)))
    noisy = clean + 0.5 * torch.randn(128, 256, generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256))

    def loss(model, batch):
        value = si_snr(model(batch[0]), batch[1]).mean()
        return -value if negated else value

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(noisy, clean), batch_size=16, shuffle=True), loss_fn=loss,
                           checks=[FirstBatchCheck(), LossBoundsCheck()])
    found = [issue for issue in report.check("step.loss_bounds").issues if issue.code == "LOSS_REWARDS_MISTAKES"]
    assert bool(found) == fires
    if fires:
        assert "highest for a perfect prediction" in found[0].message and "batch field 1" in found[0].message
        assert "-si_snr" in found[0].fix


def test_a_regression_and_an_autoencoder_prefer_their_exact_targets():
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
    for target, loss_fn in ((x @ torch.ones(8, 4), nn.MSELoss()), (None, lambda m, b: F.mse_loss(m(b[0]), b[0]))):
        data = TensorDataset(x) if target is None else TensorDataset(x, target)
        model = nn.Linear(8, 8 if target is None else 4)
        report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=32),
                               loss_fn=loss_fn, checks=[FirstBatchCheck(), LossBoundsCheck()])
        assert not [i for i in report.check("step.loss_bounds").issues if i.code == "LOSS_REWARDS_MISTAKES"]


@pytest.mark.parametrize("oriented, fires", [(True, False), (False, True)], ids=["s_i_minus_s_j", "s_j_minus_s_i"])
def test_a_ranknet_loss_whose_pairs_run_the_other_way(oriented, fires):
    g = torch.Generator().manual_seed(0)
    features = torch.randn(256, 10, 6, generator=g)  # 256 queries of 10 documents
    grades = (features[..., 0] * 1.5 + 2).round().clamp(0, 4)
    first, second = torch.triu_indices(10, 10, 1)

    def ranknet(model, batch):
        x, relevance = batch
        scores = model(x).squeeze(-1)
        diff = scores[:, first] - scores[:, second] if oriented else scores[:, second] - scores[:, first]
        keep = relevance[:, first] != relevance[:, second]
        return F.binary_cross_entropy_with_logits(diff[keep], (relevance[:, first] > relevance[:, second]).float()[keep])

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(features, grades), batch_size=16, shuffle=True), loss_fn=ranknet,
                           checks=[FirstBatchCheck(), LossBoundsCheck()])
    found = [issue for issue in report.check("step.loss_bounds").issues if issue.code == "LOSS_REWARDS_MISTAKES"]
    assert bool(found) == fires
    if fires:
        assert "ranks the worst items first" in found[0].message and "s_i - s_j" in found[0].fix
