"""Loss conventions torch accepts without a word, each broken the way users break it and
written correctly: label_smoothing given as the confidence kept (LABEL_SMOOTHING_TOO_HIGH),
nn.KLDivLoss's default reduction='mean' (KL_DIV_MEAN_REDUCTION), the stop-gradient on the
prediction instead of the TD target (PREDICTION_DETACHED), a derivative taken without
create_graph (DERIVATIVE_WITHOUT_GRAPH, with FGSM's sign() as the quiet use), and a VAE's
KL term added with the wrong sign (LOSS_UNBOUNDED_BELOW); distillation on log-probabilities
stays quiet there."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.derivative_graph import DerivativeGraphCheck
from optimus_preflight.preflight.checks.loss_bounds import LossBoundsCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, GradientsCheck, LossFunctionCheck
from optimus_preflight.preflight.checks.trained_tensors import FreshTensorsCheck


def issues(model, loss_fn, loader, check, code):
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), check])
    return [i for i in report.check(check.name).issues if i.code == code]


def classes_loader(features=12, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(256, features, generator=g), torch.randint(0, classes, (256,), generator=g)),
                      batch_size=32, shuffle=True)


@pytest.mark.parametrize("smoothing", [0.9, 0.1])
def test_label_smoothing_given_as_the_confidence_kept(smoothing):
    found = issues(nn.Linear(12, 5), nn.CrossEntropyLoss(label_smoothing=smoothing), classes_loader(),
                   LossFunctionCheck(), "LABEL_SMOOTHING_TOO_HIGH")
    assert bool(found) == (smoothing == 0.9)
    if found:
        assert "0.28" in found[0].message and "label_smoothing=0.1" in found[0].fix


@pytest.mark.parametrize("reduction", ["mean", "batchmean"])
def test_kl_div_with_its_default_mean_reduction(reduction):
    teacher = nn.Linear(12, 5)
    kl = nn.KLDivLoss() if reduction == "mean" else nn.KLDivLoss(reduction=reduction)

    def distill(model, batch):
        x, _ = batch
        with torch.no_grad():
            target = F.softmax(teacher(x) / 2.0, dim=-1)
        return kl(F.log_softmax(model(x) / 2.0, dim=-1), target) * 4.0

    found = issues(nn.Linear(12, 5), distill, classes_loader(), LossFunctionCheck(), "KL_DIV_MEAN_REDUCTION")
    assert bool(found) == (reduction == "mean")
    if found:
        assert "5 times smaller" in found[0].message and "batchmean" in found[0].fix


@pytest.mark.parametrize("detached", ["prediction", "target"])
def test_td_loss_with_the_stop_gradient_on_the_prediction(detached):
    g = torch.Generator().manual_seed(1)
    s, s_next = torch.randn(512, 6, generator=g), torch.randn(512, 6, generator=g)
    loader = DataLoader(TensorDataset(s, torch.randn(512, generator=g), s_next), batch_size=64, shuffle=True)

    def td(model, batch):
        state, reward, following = batch
        value, bootstrap = model(state).squeeze(-1), reward + 0.9 * model(following).squeeze(-1)
        if detached == "prediction":
            return F.mse_loss(value.detach(), bootstrap)
        return F.mse_loss(value, bootstrap.detach())

    found = issues(nn.Linear(6, 1), td, loader, LossFunctionCheck(), "PREDICTION_DETACHED")
    assert bool(found) == (detached == "prediction")
    if found:
        assert "V(s').detach()" not in found[0].fix and ".detach()" in found[0].fix


def pinn_loss(create_graph: bool):
    def residual(model, batch):
        x = batch[0].detach().clone().requires_grad_(True)
        du = torch.autograd.grad(model(x).sum(), x, create_graph=create_graph)[0]
        return (du - torch.cos(2 * x)).pow(2).mean() + model(torch.zeros(1, 1)).pow(2).mean()
    return residual


def pinn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))


def pinn_loader():
    return DataLoader(TensorDataset(torch.rand(512, 1, generator=torch.Generator().manual_seed(2)) * 3), batch_size=64)


@pytest.mark.parametrize("create_graph", [False, True])
def test_a_physics_residual_differentiated_without_create_graph(create_graph):
    found = issues(pinn(), pinn_loss(create_graph), pinn_loader(), DerivativeGraphCheck(), "DERIVATIVE_WITHOUT_GRAPH")
    assert bool(found) == (not create_graph)
    if found:
        assert "create_graph=True" in found[0].fix


@pytest.mark.parametrize("create_graph", [False, True])
def test_a_second_derivative_without_create_graph_in_a_residual_scaled_small_beside_the_boundary(create_graph):
    """u_xx from u_x without the graph, the residual divided by pi**4 and the boundary term x10:
    forcing the graph moves the weights' gradient by a few percent only, still the whole PDE term."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))

    def residual(m, batch):
        x = batch[0].clone().requires_grad_(True)
        u = m(x)
        u_x = torch.autograd.grad(u, x, torch.ones_like(u), create_graph=True)[0]
        u_xx = torch.autograd.grad(u_x, x, torch.ones_like(u_x), create_graph=create_graph)[0]
        pde = ((u_xx + torch.pi ** 2 * torch.sin(torch.pi * x)) ** 2).mean() / torch.pi ** 4
        return pde + 10 * m(torch.tensor([[0.0], [1.0]])).pow(2).mean()

    found = issues(model, residual, pinn_loader(), DerivativeGraphCheck(), "DERIVATIVE_WITHOUT_GRAPH")
    assert bool(found) == (not create_graph)


def test_a_residual_made_only_of_the_outputs_derivatives_reaches_the_output():
    # A hard-constrained PINN: u = x (1 - x) NN(x) meets the boundary by construction, so the loss is the PDE
    # residual alone, built from autograd.grad with create_graph: no term holds the output's own node.
    class HardConstraint(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))

        def forward(self, x):
            return x * (1 - x) * self.net(x)

    def residual(model, batch):
        x = batch[0].detach().clone().requires_grad_(True)
        u = model(x)
        du = torch.autograd.grad(u.sum(), x, create_graph=True)[0]
        d2u = torch.autograd.grad(du.sum(), x, create_graph=True)[0]
        return (d2u + torch.sin(torch.pi * x)).pow(2).mean()

    assert not issues(HardConstraint(), residual, pinn_loader(), GradientsCheck(), "LOSS_NOT_FROM_OUTPUT")


def test_an_fgsm_perturbation_taken_without_create_graph_is_quiet():
    def adversarial(model, batch):
        x, y = batch
        x = x.clone().requires_grad_(True)
        grad = torch.autograd.grad(F.cross_entropy(model(x), y), x)[0]
        return F.cross_entropy(model(x.detach() + 0.05 * grad.sign()), y)

    assert not issues(nn.Linear(12, 5), adversarial, classes_loader(), DerivativeGraphCheck(), "DERIVATIVE_WITHOUT_GRAPH")


def test_an_input_made_differentiable_is_not_a_layer_created_in_forward():
    assert not issues(pinn(), pinn_loss(True), pinn_loader(), FreshTensorsCheck(), "PARAM_CREATED_IN_FORWARD")


class Vae(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.encoder, self.decoder = nn.Linear(16, 8), nn.Linear(4, 16)

    def forward(self, x):
        mu, logvar = self.encoder(x).chunk(2, dim=-1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.decoder(z), mu, logvar


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["kl_added_with_the_wrong_sign", "elbo"])
def test_a_vae_kl_term_with_the_wrong_sign_has_no_lower_bound(sign):
    def elbo(model, batch):
        x = batch[0]
        reconstruction, mu, logvar = model(x)
        kl = sign * 0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(-1).mean()
        return F.mse_loss(reconstruction, x) + kl

    loader = DataLoader(TensorDataset(torch.randn(256, 16, generator=torch.Generator().manual_seed(4))), batch_size=32)
    found = issues(Vae(), elbo, loader, LossBoundsCheck(), "LOSS_UNBOUNDED_BELOW")
    assert bool(found) == (sign == 1.0)
    if found:
        assert "KL" in found[0].fix


def test_distillation_on_log_probabilities_is_not_unbounded():
    """Shifting log-probabilities would lower a KL without bound, but no model output can move
    off the simplex its log_softmax keeps it on."""
    teacher = nn.Linear(12, 5)

    class Student(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(12, 5)

        def forward(self, x):
            return F.log_softmax(self.linear(x), dim=-1)

    def distill(model, batch):
        with torch.no_grad():
            target = F.softmax(teacher(batch[0]), dim=-1)
        return F.kl_div(model(batch[0]), target, reduction="batchmean")

    assert not issues(Student(), distill, classes_loader(), LossBoundsCheck(), "LOSS_UNBOUNDED_BELOW")


class TwoTasks(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.trunk, self.heads = nn.Linear(12, 16), nn.Linear(16, 2)
        self.log_vars = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        return self.heads(torch.relu(self.trunk(x)))


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["exp_log_var_times_loss", "exp_minus_log_var"])
def test_uncertainty_task_weights_with_the_sign_flipped(sign):
    def weighted(model, batch):
        x, y = batch
        out = model(x)
        losses = torch.stack([F.mse_loss(out[:, 0], y[:, 0]), F.mse_loss(out[:, 1], y[:, 1])])
        return (torch.exp(sign * model.log_vars) * losses + model.log_vars).sum()

    g = torch.Generator().manual_seed(6)
    loader = DataLoader(TensorDataset(torch.randn(256, 12, generator=g), torch.randn(256, 2, generator=g)), batch_size=32)
    found = issues(TwoTasks(), weighted, loader, LossBoundsCheck(), "LOSS_UNBOUNDED_BELOW")
    assert bool(found) == (sign == 1.0)
    if found:
        assert "'log_vars'" in found[0].message and "exp(-log_var)" in found[0].fix


class TokenMean:
    def __init__(self, running: bool):
        self.running, self.tokens = running, 0

    def __call__(self, model, batch):
        x, y = batch
        loss_sum = F.cross_entropy(model(x), y, reduction="sum")
        self.tokens = self.tokens + len(y) if self.running else len(y)
        return loss_sum / self.tokens


@pytest.mark.parametrize("running", [True, False], ids=["running_total", "this_batch"])
def test_a_loss_normaliser_that_is_a_running_total(running):
    found = issues(nn.Linear(12, 5), TokenMean(running), classes_loader(), LossBoundsCheck(), "LOSS_SHRINKS_EACH_CALL")
    assert bool(found) == running
    if found:
        assert "self.tokens" in found[0].message


@pytest.mark.parametrize("dim", [0, 1])
def test_action_values_gathered_along_the_batch_axis(dim):
    g = torch.Generator().manual_seed(7)
    loader = DataLoader(TensorDataset(torch.randn(512, 12, generator=g), torch.randint(0, 4, (512,), generator=g),
                                      torch.randn(512, generator=g)), batch_size=64, shuffle=True)

    def q_loss(model, batch):
        x, actions, reward = batch
        return F.smooth_l1_loss(model(x).gather(dim, actions.unsqueeze(1)).squeeze(1), reward)

    found = issues(nn.Linear(12, 4), q_loss, loader, LossFunctionCheck(), "GATHER_ALONG_BATCH")
    assert bool(found) == (dim == 0)
    if found:
        assert "gather(1, actions.unsqueeze(1))" in found[0].fix


@pytest.mark.parametrize("subscripts", ["bd,be->b", "bd,bd->b"])
def test_an_einsum_whose_factor_axis_is_not_shared(subscripts):
    class Factorisation(nn.Module):
        def __init__(self):
            super().__init__()
            self.user, self.item = nn.Embedding(40, 8), nn.Embedding(60, 8)

        def forward(self, u, i):
            return torch.einsum(subscripts, self.user(u), self.item(i))

    g = torch.Generator().manual_seed(8)
    loader = DataLoader(TensorDataset(torch.randint(0, 40, (512,), generator=g), torch.randint(0, 60, (512,), generator=g),
                                      torch.randn(512, generator=g)), batch_size=64, shuffle=True)
    found = issues(Factorisation(), lambda model, batch: F.mse_loss(model(batch[0], batch[1]), batch[2]), loader,
                   LossFunctionCheck(), "EINSUM_NOT_CONTRACTED")
    assert bool(found) == (subscripts == "bd,be->b")


class SelfAttentionPool(nn.Module):
    """Hand-written self-attention over token embeddings; ``weights`` says how its scores are turned
    into weights: the bug (over the queries), the correct softmax, a slot-attention style
    renormalisation, and an attention pooling over (B, T, 1) scores."""

    def __init__(self, weights: str):
        super().__init__()
        torch.manual_seed(0)
        self.weights = weights
        self.embed, self.q, self.k, self.v = nn.Embedding(30, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.score, self.head = nn.Linear(16, 1), nn.Linear(16, 2)

    def forward(self, ids):
        e = self.embed(ids)
        scores = self.q(e) @ self.k(e).transpose(1, 2) / 4.0
        if self.weights == "pooled":  # (B, T, 1) scores over the positions, applied as (B, 1, T) @ (B, T, D)
            attention = torch.softmax(self.score(e), dim=1)
            return self.head((attention.transpose(1, 2) @ self.v(e)).squeeze(1))
        if self.weights == "over_queries":
            mixed = torch.softmax(scores, dim=1) @ self.v(e)
        elif self.weights == "over_keys":
            mixed = torch.softmax(scores, dim=-1) @ self.v(e)
        else:  # slot attention: softmax over the slots, then renormalised over the inputs
            attention = torch.softmax(scores, dim=1)
            mixed = (attention / attention.sum(dim=-1, keepdim=True)) @ self.v(e)
        return self.head(mixed.mean(dim=1))


@pytest.mark.parametrize("weights", ["over_queries", "over_keys", "renormalised", "pooled"])
def test_attention_weights_normalised_over_the_queries(weights):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 30, (256, 10), generator=g)
    loader = DataLoader(TensorDataset(ids, (ids[:, 0] > 15).long()), batch_size=32, shuffle=True)
    found = issues(SelfAttentionPool(weights), nn.CrossEntropyLoss(), loader, LossFunctionCheck(), "SOFTMAX_OFF_AXIS")
    if weights == "over_queries":
        assert len(found) == 1 and "(32, 10, 10)" in found[0].message and "softmax over dim 1" in found[0].message
        assert "dim=-1" in found[0].fix
    else:
        assert not found


class PointSet(nn.Module):
    def __init__(self, sort_dim):
        super().__init__()
        self.sort_dim, self.head = sort_dim, nn.Linear(3, 2)
        self.router = nn.Linear(3, 4)

    def forward(self, points):
        canonical = torch.sort(points)[0] if self.sort_dim is None else torch.sort(points, dim=self.sort_dim)[0]
        torch.sort(self.router(points), descending=True)  # top-k routing over 4 experts: a sort of model outputs
        return self.head(canonical.mean(1))


@pytest.mark.parametrize("sort_dim", [None, 1], ids=["default_dim", "points_axis"])
def test_a_point_set_sorted_along_its_coordinates(sort_dim):
    g = torch.Generator().manual_seed(9)
    loader = DataLoader(TensorDataset(torch.randn(256, 32, 3, generator=g), torch.randint(0, 2, (256,), generator=g)),
                        batch_size=32)
    found = issues(PointSet(sort_dim), nn.CrossEntropyLoss(), loader, LossFunctionCheck(), "SORT_ALONG_LAST_DIM")
    assert bool(found) == (sort_dim is None)


@pytest.mark.parametrize("sigma", [0.05, 1.5], ids=["sigma_in_normalised_units", "sigma_in_pixels"])
def test_heatmap_targets_that_vanish_at_every_pixel(sigma):
    g = torch.Generator().manual_seed(10)
    centres = torch.rand(256, 2, generator=g) * 18 + 3
    yy, xx = torch.meshgrid(torch.arange(24.0), torch.arange(24.0), indexing="ij")
    d2 = (xx - centres[:, 0, None, None]) ** 2 + (yy - centres[:, 1, None, None]) ** 2
    heatmaps = torch.exp(-d2 / (2 * sigma ** 2)).unsqueeze(1)
    images = (torch.exp(-d2 / 8) + 0.3 * torch.randn(256, 24, 24, generator=g)).unsqueeze(1)
    loader = DataLoader(TensorDataset(images, heatmaps), batch_size=32, shuffle=True)
    found = issues(nn.Conv2d(1, 1, 3, padding=1), lambda model, batch: F.mse_loss(model(batch[0]), batch[1]), loader,
                   LossFunctionCheck(), "TARGET_MAPS_VANISH")
    assert bool(found) == (sigma == 0.05)


@pytest.mark.parametrize("drawn_at, sigma, fires", [("input_pixels", 1.0, True), ("map_cells", 1.0, False),
                                                     ("map_cells", 0.5, False)],
                         ids=["keypoints_in_input_pixels", "divided_by_the_stride", "small_sigma_with_invisible"])
def test_heatmaps_centred_off_the_map_by_a_missing_stride(drawn_at, sigma, fires):
    g = torch.Generator().manual_seed(11)
    keypoints = torch.rand(256, 2, 2, generator=g) * 32  # two keypoints per 32x32 image, in input pixels
    centres = keypoints if drawn_at == "input_pixels" else keypoints / 4  # an 8x8 heatmap: stride 4
    yy, xx = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
    d2 = (xx - centres[..., 0, None, None]) ** 2 + (yy - centres[..., 1, None, None]) ** 2
    heatmaps = torch.exp(-d2 / (2 * sigma ** 2))
    heatmaps[torch.rand(256, 2, generator=g) < 0.3] = 0  # invisible keypoints: empty maps
    images = torch.randn(256, 1, 32, 32, generator=g)
    model = nn.Sequential(nn.Conv2d(1, 2, 3, stride=4, padding=1))
    loader = DataLoader(TensorDataset(images, heatmaps), batch_size=32, shuffle=True)
    found = issues(model, lambda model, batch: F.mse_loss(model(batch[0]), batch[1]), loader, LossFunctionCheck(),
                   "TARGET_MAPS_VANISH")
    assert bool(found) == fires
    if found:
        assert "centred outside the 8x8 map" in found[0].message and "stride" in found[0].fix


@pytest.mark.parametrize("form, fires", [("log_sigmoid", True), ("log_softmax_of_probabilities", True),
                                         ("epsilon", False), ("with_logits", False), ("log_softmax", False)])
def test_a_log_taken_straight_of_probabilities(form, fires):
    def loss_fn(model, batch):
        x, y = batch
        logits = model(x)
        if form == "log_sigmoid":  # a hand-written binary cross-entropy
            p = torch.sigmoid(logits[:, 0])
            return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
        if form == "epsilon":
            p = torch.sigmoid(logits[:, 0])
            return -(y * torch.log(p + 1e-7) + (1 - y) * torch.log(1 - p + 1e-7)).mean()
        if form == "with_logits":
            return F.binary_cross_entropy_with_logits(logits[:, 0], y)
        labels = y.long()
        if form == "log_softmax":
            return F.nll_loss(F.log_softmax(logits, dim=1), labels)
        return F.nll_loss(torch.log(torch.softmax(logits, dim=1)), labels)

    g = torch.Generator().manual_seed(4)
    loader = DataLoader(TensorDataset(torch.randn(256, 12, generator=g), torch.randint(0, 2, (256,), generator=g).float()),
                        batch_size=32, shuffle=True)
    found = issues(nn.Linear(12, 2), loss_fn, loader, LossFunctionCheck(), "LOSS_LOG_OF_PROBABILITY")
    assert bool(found) == fires
    if fires:
        assert "binary_cross_entropy_with_logits" in found[0].fix and "log_softmax" in found[0].fix


class MaskedAttentionPool(nn.Module):
    """Attention pooling over right-padded token ids; ``fill`` is how the padding is masked."""

    def __init__(self, fill: str):
        super().__init__()
        torch.manual_seed(0)
        self.fill = fill
        self.embed, self.score, self.head = nn.Embedding(30, 16), nn.Linear(16, 1), nn.Linear(16, 2)

    def forward(self, ids):
        e = self.embed(ids)
        scores = self.score(e).squeeze(-1)
        if self.fill == "zero":
            scores = scores.masked_fill(ids == 0, 0.0)
        elif self.fill == "multiply":
            scores = scores * (ids != 0).float()
        else:
            scores = scores.masked_fill(ids == 0, float("-inf") if self.fill == "-inf" else torch.finfo(scores.dtype).min)
        return self.head((torch.softmax(scores, dim=1).unsqueeze(-1) * e).sum(1))


@pytest.mark.parametrize("fill, fires", [("zero", True), ("multiply", True), ("-inf", False), ("finfo_min", False)])
def test_attention_scores_masked_with_zero(fill, fires):
    g = torch.Generator().manual_seed(6)
    ids = torch.zeros(256, 20, dtype=torch.long)
    for row in ids:
        length = int(torch.randint(3, 10, (1,), generator=g))
        row[:length] = torch.randint(1, 30, (length,), generator=g)
    loader = DataLoader(TensorDataset(ids, (ids[:, 0] > 15).long()), batch_size=32, shuffle=True)
    found = issues(MaskedAttentionPool(fill), nn.CrossEntropyLoss(), loader, LossFunctionCheck(), "MASK_FILLED_WITH_ZERO")
    assert bool(found) == fires
    if fires:
        assert "(32, 20)" in found[0].message and "float('-inf')" in found[0].fix


class TinyVae(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder, self.decoder = nn.Linear(32, 8), nn.Linear(4, 32)

    def forward(self, x):
        mu, logvar = self.encoder(x).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.decoder(z), mu, logvar


@pytest.mark.parametrize("recon, kl, fires", [("mean", "sum", True), ("sum", "sum", False),
                                               ("mean", "mean", False), ("sum_per_sample", "sum_per_sample", False)])
def test_a_per_element_mean_beside_a_term_summed_over_the_batch(recon, kl, fires):
    def loss_fn(model, batch):
        (x,) = batch
        out, mu, logvar = model(x)
        terms = 1 + logvar - mu.pow(2) - logvar.exp()
        kld = {"sum": -0.5 * torch.sum(terms), "mean": -0.5 * terms.mean(),
               "sum_per_sample": -0.5 * torch.sum(terms) / len(x)}[kl]
        rec = {"mean": F.mse_loss(out, x), "sum": F.mse_loss(out, x, reduction="sum"),
               "sum_per_sample": F.mse_loss(out, x, reduction="sum") / len(x)}[recon]
        return rec + kld

    data = DataLoader(TensorDataset(torch.randn(256, 32, generator=torch.Generator().manual_seed(5))), batch_size=32,
                      shuffle=True)
    found = issues(TinyVae(), loss_fn, data, LossFunctionCheck(), "LOSS_REDUCTIONS_MIXED")
    assert bool(found) == fires
    if fires:
        assert "(32, 32)" in found[0].message and "(32, 4)" in found[0].message and "reduction='sum'" in found[0].fix


@pytest.mark.parametrize("form, kind", [
    ("bce_mean_kl_per_sample", "values"), ("kl_summed_over_the_batch_axis", "batch"),
    ("both_per_sample", None), ("kl_over_latents_then_batch_mean", None), ("ce_with_mse_aux", None)])
def test_terms_reduced_per_axis_on_different_scales(form, kind):
    def loss_fn(model, batch):
        (x,) = batch
        out, mu, logvar = model(x)
        terms = 1 + logvar - mu.pow(2) - logvar.exp()
        probabilities = torch.sigmoid(out)
        target = (x > 0).float()
        if form == "bce_mean_kl_per_sample":  # Keras habit: the default mean beside a KL summed per sample
            return F.binary_cross_entropy(probabilities, target) - 0.5 * torch.sum(terms) / x.size(0)
        if form == "kl_summed_over_the_batch_axis":
            return F.binary_cross_entropy(probabilities, target, reduction="sum") / x.size(0) \
                - 0.5 * torch.sum(terms, dim=0).mean()
        if form == "both_per_sample":
            return F.binary_cross_entropy(probabilities, target, reduction="sum") / x.size(0) \
                - 0.5 * torch.sum(terms) / x.size(0)
        if form == "kl_over_latents_then_batch_mean":
            return F.binary_cross_entropy(probabilities, target, reduction="none").sum(1).mean() \
                - 0.5 * torch.sum(terms, dim=1).mean()
        return F.mse_loss(out, x) + 0.1 * F.mse_loss(mu, torch.zeros_like(mu))

    data = DataLoader(TensorDataset(torch.randn(256, 32, generator=torch.Generator().manual_seed(5))), batch_size=32,
                      shuffle=True)
    found = issues(TinyVae(), loss_fn, data, LossFunctionCheck(), "LOSS_REDUCTIONS_MIXED")
    assert bool(found) == bool(kind)
    if kind == "values":
        assert "averaged over each sample's 32 values" in found[0].message and "weighs 32 times more" in found[0].message
        assert "reduction='sum') / batch_size" in found[0].fix
    elif kind == "batch":
        assert "summed over the batch (dim 0 of a (32, 4) tensor" in found[0].message
        assert "kl.sum(dim=1).mean()" in found[0].fix


def test_weight_decay_summed_over_parameters_is_not_a_batch_sum():
    model = nn.Linear(12, 5)

    def loss_fn(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y) + 1e-4 * sum(p.pow(2).sum() for p in model.parameters())

    assert not issues(model, loss_fn, classes_loader(), LossFunctionCheck(), "LOSS_REDUCTIONS_MIXED")


@pytest.mark.parametrize("order", ["swapped", "right"])
def test_distillation_with_kl_div_arguments_swapped(order):
    teacher = nn.Linear(12, 5).requires_grad_(False)

    def distill(model, batch):
        x, _ = batch
        student, target = F.softmax(model(x) / 2.0, dim=-1), F.softmax(teacher(x) / 2.0, dim=-1)
        if order == "swapped":  # kl_div(teacher log-probs, student probs)
            return F.kl_div(target.log(), student, reduction="batchmean")
        return F.kl_div(student.log(), target, reduction="batchmean")

    found = issues(nn.Linear(12, 5), distill, classes_loader(), LossFunctionCheck(), "PREDICTION_DETACHED")
    assert bool(found) == (order == "swapped")
    if found:
        assert "kl_div(student_log_probs, teacher_probs)" in found[0].fix


class Distiller(nn.Module):
    """A Keras-style distiller holding a teacher and a student; the optimizer gets model.parameters()."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.teacher, self.student = nn.Linear(12, 5), nn.Linear(12, 5)


@pytest.mark.parametrize("teacher", ["trained", "no_grad"])
def test_a_teacher_the_distillation_term_trains(teacher):
    def distill(model, batch):
        x, y = batch
        if teacher == "no_grad":
            with torch.no_grad():
                t_logits = model.teacher(x)
        else:
            t_logits = model.teacher(x)
        s_logits = model.student(x)
        soft = F.kl_div(F.log_softmax(s_logits / 4, dim=1), F.softmax(t_logits / 4, dim=1), reduction="batchmean")
        return 16 * soft + F.cross_entropy(s_logits, y)

    found = issues(Distiller(), distill, classes_loader(), LossFunctionCheck(), "TEACHER_TRAINED")
    assert bool(found) == (teacher == "trained")
    if found:
        assert "torch.no_grad()" in found[0].fix and "requires_grad_(False)" in found[0].fix


@pytest.mark.parametrize("boxes, fires", [("original_pixels_normalised", True), ("resized_normalised", False),
                                          ("resized_pixels", False), ("four_counts", False)])
def test_box_targets_that_end_past_the_resized_image(boxes, fires):
    from optimus_preflight.preflight.checks.step_checks import TargetsCheck

    g = torch.Generator().manual_seed(12)
    sizes = torch.randint(16, 65, (512, 1), generator=g).float()  # the original images: 16 to 64 px, resized to 32
    corner = torch.rand(512, 2, generator=g) * 0.5 * sizes
    extent = (0.2 + 0.3 * torch.rand(512, 2, generator=g)) * sizes
    original = torch.cat([corner, corner + extent], 1)  # xyxy in the original image's pixels
    targets = {"original_pixels_normalised": original / 32, "resized_normalised": original / sizes,
               "resized_pixels": original * 32 / sizes,
               "four_counts": torch.randint(0, 40, (512, 4), generator=g).float()}[boxes]
    images = torch.randn(512, 1, 32, 32, generator=g)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, stride=4), nn.Flatten(), nn.Linear(4 * 8 * 8, 4))
    loader = DataLoader(TensorDataset(images, targets), batch_size=32, shuffle=True)
    found = issues(model, nn.SmoothL1Loss(), loader, TargetsCheck(), "TARGET_SCALE")
    found = [issue for issue in found if "box targets" in issue.message]
    assert bool(found) == fires
    if found:
        assert "normalised to [0, 1]" in found[0].message and "new_w / old_w" in found[0].fix


@pytest.mark.parametrize("sides, fires", [("h_w_from_pil_size", True), ("w_h_from_pil_size", False)])
def test_point_targets_normalised_by_the_wrong_side(sides, fires):
    from optimus_preflight.preflight.checks.step_checks import TargetsCheck

    # crops half portrait (16 wide, 32 high), half landscape, resized to 16x16; the target is a
    # blob's centre as a fraction of the crop's width and height
    g = torch.Generator().manual_seed(13)
    portrait = torch.rand(512, generator=g) < 0.5
    width, height = torch.where(portrait, 16.0, 32.0), torch.where(portrait, 32.0, 16.0)
    x, y = torch.rand(512, generator=g) * width, torch.rand(512, generator=g) * height
    targets = torch.stack([x / height, y / width] if sides == "h_w_from_pil_size" else [x / width, y / height], 1)
    images = torch.randn(512, 1, 16, 16, generator=g)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2), nn.Flatten(), nn.Linear(4 * 7 * 7, 2))
    loader = DataLoader(TensorDataset(images, targets), batch_size=32, shuffle=True)
    found = [i for i in issues(model, nn.MSELoss(), loader, TargetsCheck(), "TARGET_SCALE") if "point" in i.message]
    assert bool(found) == fires
    if found:
        assert "w, h = img.size" in found[0].fix


@pytest.mark.parametrize("noise, target, fires", [("rand_like", "noise", True), ("randn_like", "noise", False),
                                                  ("rand_like", "clean", False)],
                         ids=["uniform_noise_predicted", "gaussian_noise_predicted", "uniform_noise_removed"])
def test_a_denoiser_trained_to_predict_uniform_noise(noise, target, fires):
    def loss_fn(model, batch):
        x = batch[0]
        eps = getattr(torch, noise)(x)
        x_t = 0.8 * x + 0.6 * eps
        return F.mse_loss(model(x_t), eps if target == "noise" else x)

    g = torch.Generator().manual_seed(13)
    loader = DataLoader(TensorDataset(torch.randn(256, 32, generator=g)), batch_size=32, shuffle=True)
    found = issues(nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Linear(64, 32)), loss_fn, loader,
                   LossFunctionCheck(), "NOISE_NOT_GAUSSIAN")
    assert bool(found) == fires
    if found:
        assert "torch.rand_like" in found[0].message and "randn_like" in found[0].fix
