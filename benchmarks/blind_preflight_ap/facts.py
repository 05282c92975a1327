"""The fact each broken case of set ap rests on, printed without the preflight (attached to FIXES[name]["fact"])."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .registry import FIXES, T_STEPS, Views, alpha_bar, betas, sbm_graph


def fact(name):
    def attach(fn):
        FIXES[name]["fact"] = fn
        return fn
    return attach


def _load():
    from . import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained  # noqa: F401


_load()


@fact("s_ae_recon_broadcast")
def _():
    out, x = torch.rand(4, 64), torch.rand(4, 1, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = nn.MSELoss(reduction="none")(out, x)
    print(f"  fact: MSELoss({tuple(out.shape)}, {tuple(x.shape)}) broadcasts to {tuple(loss.shape)}")


@fact("s_vae_kl_sum_over_batch")
def _():
    mu, lv = torch.randn(128, 8), torch.zeros(128, 8)
    term = 1 + lv - mu ** 2 - lv.exp()
    print(f"  fact: KL summed over dim=0 then mean: {(-0.5 * term.sum(0).mean()).item():.1f}; "
          f"over dim=1 then mean: {(-0.5 * term.sum(1).mean()).item():.2f} (x{128 / 8:.0f})")


@fact("s_siamese_keepdim_broadcast")
def _():
    d, y = F.pairwise_distance(torch.randn(5, 3), torch.randn(5, 3), keepdim=True), torch.ones(5)
    print(f"  fact: d {tuple(d.shape)} * y {tuple(y.shape)} -> {tuple((y * d ** 2).shape)}")


@fact("s_triplet_cdist_matrix")
def _():
    a, p = torch.randn(6, 4), torch.randn(6, 4)
    print(f"  fact: cdist(a, p) is {tuple(torch.cdist(a, p).shape)}; pairwise_distance(a, p) is "
          f"{tuple(F.pairwise_distance(a, p).shape)}")


@fact("s_attention_softmax_singleton_dim")
def _():
    s = torch.randn(2, 5, 1)
    print(f"  fact: softmax over dim=-1 of (2, 5, 1) scores: {torch.softmax(s, -1).flatten()[:5].tolist()}")


@fact("t_infonce_zero_labels")
def _():
    print("  fact: logits = z1 @ z2.T put sample i's positive at column i; labels zeros(N) name column 0 for every row")


@fact("t_diffusion_target_noisy_input")
def _():
    x0 = torch.randn(1000, 8)
    ab = alpha_bar()
    a = ab[torch.randint(0, T_STEPS, (1000,))].view(-1, 1)
    eps = torch.randn_like(x0)
    xt = a.sqrt() * x0 + (1 - a).sqrt() * eps
    print(f"  fact: corr(x_t, eps) = {torch.corrcoef(torch.stack([xt.flatten(), eps.flatten()]))[0, 1]:.2f}: "
          "a net fitting x_t is not a noise predictor")


@fact("t_denoiser_noisy_target")
def _():
    print("  fact: the minimiser of mse(model(noisy), noisy) is the identity; its error to the clean images is the "
          "noise std 0.3")


@fact("t_gnn_prefix_vs_train_idx")
def _():
    x, adj, y, train, val = sbm_graph(s=1)
    idx = train.nonzero().flatten()
    print(f"  fact: first train_idx {idx[:6].tolist()} vs out[:n_train] rows 0..5; labels agree on "
          f"{(y[:len(idx)] == y[idx]).float().mean():.2f} of the pairs (chance 0.25)")


@fact("t_contrastive_label_convention_flipped")
def _():
    y, d = torch.tensor([1.0]), torch.tensor([0.1])
    print(f"  fact: a matching pair (y=1) at distance 0.1 costs {((1 - y) * d ** 2 + y * F.relu(1 - d) ** 2).item():.2f} "
          "under (1-y)*d^2 + y*relu(m-d)^2: it is pushed apart")


@fact("w_ae_optimizer_encoder_only")
def _():
    from .cases_trained import ConvLikeAE
    m = ConvLikeAE()
    opt = torch.optim.Adam(m.encoder.parameters())
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    print(f"  fact: optimizer holds {len(held)} of {len(list(m.parameters()))} tensors; decoder tensors held: "
          f"{sum(id(p) in held for p in m.decoder.parameters())}")


@fact("w_gnn_weights_in_python_list")
def _():
    from .cases_trained import ListGCN
    print(f"  fact: registered parameters {[n for n, _ in ListGCN(False).named_parameters()]}")


@fact("w_two_tower_one_optimized")
def _():
    from .cases_trained import TwoTower
    m = TwoTower()
    print(f"  fact: optimizer gets {len(list(m.query.parameters()))} of {len(list(m.parameters()))} tensors; "
          "model.cand is never stepped")


@fact("w_multitask_trunk_detached_for_cls")
def _():
    from .cases_trained import TwoTask
    m = TwoTask(False)
    F.cross_entropy(m(torch.randn(4, 20))[1], torch.zeros(4, dtype=torch.long)).backward()
    print(f"  fact: trunk grad after the classification loss alone: {m.trunk[0].weight.grad}")


@fact("w_vae_encoder_under_no_grad")
def _():
    from .cases_trained import NoGradEncVAE
    recon, mu, lv = NoGradEncVAE(False)(torch.rand(4, 64))
    print(f"  fact: mu.requires_grad = {mu.requires_grad}, logvar.requires_grad = {lv.requires_grad}")


@fact("m_uncertainty_weights_no_log_term")
def _():
    s = torch.zeros(1, requires_grad=True)
    (torch.tensor(1.3) * torch.exp(-s)).sum().backward()
    print(f"  fact: d/ds [L * exp(-s)] = {s.grad.item():.2f} < 0 for every L > 0: s only grows, the weight exp(-s) -> 0")


@fact("m_vae_kl_sign_flipped")
def _():
    mu, lv = torch.zeros(8), torch.zeros(8)
    kld = -0.5 * torch.sum(1 + lv - mu ** 2 - lv.exp())
    print(f"  fact: kld at the prior is {kld.item():.1f} and >= 0 elsewhere; loss = recon - kld rewards moving away")


@fact("m_diffusion_alpha_bar_not_cumprod")
def _():
    a = 1 - betas()
    print(f"  fact: min(1 - betas) = {a.min():.3f} (noise share {(1 - a.min()).sqrt():.2f}); "
          f"cumprod reaches {alpha_bar()[-1]:.3f} (noise share {(1 - alpha_bar()[-1]).sqrt():.2f})")


@fact("m_momentum_update_reversed")
def _():
    print("  fact: with param_q = 0.99 * param_q + 0.01 * param_k and param_k never changing, every step pulls the "
          "trained encoder 1% back to its initialisation")


@fact("m_temperature_multiplied")
def _():
    sim = torch.tensor([1.0, 0.0, -1.0])
    print(f"  fact: softmax(sim * 0.07) = {torch.softmax(sim * 0.07, 0).tolist()}, "
          f"softmax(sim / 0.07) = {[round(v, 4) for v in torch.softmax(sim / 0.07, 0).tolist()]}")


@fact("d_gnn_adjacency_without_self_loops")
def _():
    adj = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    print(f"  fact: row-normalised A without I: {adj.tolist()} (own weight 0); with I: "
          f"{((adj + torch.eye(2)) / 2).tolist()}")


@fact("d_gnn_train_mask_long_not_bool")
def _():
    out = torch.arange(6)
    mask = torch.tensor([0, 1, 1, 0, 1, 0])
    print(f"  fact: out[long mask] = {out[mask].tolist()}; out[mask.bool()] = {out[mask.bool()].tolist()}")


@fact("d_simclr_both_views_identical")
def _():
    v1, v2, _ = Views(4, 0, same_view=True)[0]
    print(f"  fact: view1 == view2: {torch.equal(v1, v2)}")


@fact("d_siamese_pair_labels_from_other_shuffle")
def _():
    from .cases_data import PairSet
    ps = PairSet(Views(512, 23), False, 1)
    truth = (ps.views.y == ps.views.y[ps.partner]).float()
    print(f"  fact: stored 'same' agrees with the pairs' true same-class flag on {(ps.same == truth).float().mean():.2f} "
          "of pairs")


@fact("d_diffusion_data_not_scaled")
def _():
    from .registry import manifold
    raw = (manifold(1000, 5) + 1) * 127.5
    a = alpha_bar()[T_STEPS // 2]
    print(f"  fact: data std {raw.std():.1f}; at t={T_STEPS // 2} the noise part of x_t has std {(1 - a).sqrt():.2f} "
          f"against a signal of std {(a.sqrt() * raw).std():.1f}")
