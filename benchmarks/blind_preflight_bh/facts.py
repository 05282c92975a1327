"""The fact each broken case of set bh rests on, printed without the preflight (attached to FIXES[name]["fact"])."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_bh.registry import CASES, FIXES, load_all


def _kw(name):
    return CASES[name].build()


def _batch(name):
    return next(iter(_kw(name)["train_loader"]))


def gauss_vae_recon_broadcast():
    kw = _kw("gauss_vae_recon_broadcast")
    x = next(iter(kw["train_loader"]))[0]
    out = kw["model"](x)[0]
    print(f"  batch x {tuple(x.shape)}, decoder output {tuple(out.shape)}, mse broadcast to "
          f"{tuple(torch.broadcast_shapes(out.shape, x.shape))}")


def flow_base_logprob_sum_over_batch():
    print("  base_logp(z).sum() is a scalar over the batch; logdet has shape (B,): base term weighted B=64 times")


def mdn_logsumexp_over_batch():
    kw = _kw("mdn_logsumexp_over_batch")
    x, y = next(iter(kw["train_loader"]))
    logits, mu, sigma = kw["model"](x)
    print(f"  component log-probs {tuple(mu.shape)}; logsumexp(dim=0) gives {tuple(mu.logsumexp(0).shape)} "
          f"(one value per component), not one per sample")


def vae_kl_sum_over_batch_dim():
    kw = _kw("vae_kl_sum_over_batch_dim")
    x = _batch("vae_kl_sum_over_batch_dim")[0]
    _, mu, logvar = kw["model"](x)
    print(f"  mu {tuple(mu.shape)}: KL .sum(0).mean() weights the KL {mu.shape[0] / mu.shape[1]:.0f}x vs .sum(1).mean()")


def gumbel_softmax_wrong_dim():
    kw = _kw("gumbel_softmax_wrong_dim")
    x = _batch("gumbel_softmax_wrong_dim")[0]
    q = kw["model"].logits(x)
    z = F.gumbel_softmax(q, dim=1)
    print(f"  logits {tuple(q.shape)}; with dim=1 each category sums to 1 over groups: {z.sum(1)[0, :3].tolist()}, "
          f"per-group sums {z.sum(-1)[0].tolist()}")


def _shift(name):
    def fact():
        b = _batch(name)
        print(f"  first training pair: {[t[0, :6].tolist() for t in b]}" if len(b) > 1 else
              f"  sequence {b[0][0, :6].tolist()}: loss target is the input itself (x[:, :-1] vs x[:, :-1])")
    return fact


def bce_targets_normalised_to_minus_one():
    x = _batch("bce_targets_normalised_to_minus_one")[0]
    print(f"  BCE targets (x - 0.5) / 0.5 take values {sorted(((x - 0.5) / 0.5).unique().tolist())}")


def flow_base_logprob_on_input():
    print("  loss = -(base_logp(x) + logdet): the flow output z never enters the loss except through logdet")


def bernoulli_decoder_mse_on_logits():
    print(f"  MSE optimum on logits gives p = sigmoid(0) = 0.5 and sigmoid(1) = {torch.sigmoid(torch.tensor(1.)):.3f}")


def vae_optimizer_misses_decoder():
    kw = _kw("vae_optimizer_misses_decoder")
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  decoder tensors in the optimizer: {sum(id(p) in ids for p in kw['model'].decoder.parameters())} of "
          f"{len(list(kw['model'].decoder.parameters()))}")


def flow_logdet_detached():
    print("  loss uses logdet.detach(): the log-det contributes no gradient")


def vq_no_straight_through():
    kw = _kw("vq_no_straight_through")
    x = _batch("vq_no_straight_through")[0]
    out, ze, zq = kw["model"](x)
    F.binary_cross_entropy_with_logits(out, x).backward()
    grads = [p.grad for p in kw["model"].encoder.parameters()]
    print(f"  encoder tensors with a reconstruction gradient: {sum(g is not None for g in grads)} of {len(grads)}")


def vae_sample_instead_of_rsample():
    kw = _kw("vae_sample_instead_of_rsample")
    q = torch.distributions.Normal(torch.zeros(2, requires_grad=True), torch.ones(2))
    print(f"  Normal.sample() requires grad: {q.sample().requires_grad}; rsample(): {q.rsample().requires_grad}")


def made_mask_is_parameter():
    kw = _kw("made_mask_is_parameter")
    print(f"  mask tensors among parameters: {sum('mask' in n for n, _ in kw['model'].named_parameters())}")


def kl_annealing_never_advances():
    kw = _kw("kl_annealing_never_advances")
    lf = kw["loss_fn"]
    b = next(iter(kw["train_loader"]))
    for _ in range(3):
        lf(kw["model"], b)
    print(f"  after 3 calls the annealing step is {lf.step}: beta = {min(1.0, lf.step / lf.warmup)}")


def made_output_mask_non_strict():
    kw = _kw("made_output_mask_non_strict")
    x = torch.zeros(1, 16, requires_grad=True)
    kw["model"](x)[0, 5].backward()
    print(f"  d out_5 / d x_5 = {x.grad[0, 5].item():.4f} (nonzero: output 5 sees x_5)")


def causal_conv_trims_wrong_end():
    kw = _kw("causal_conv_trims_wrong_end")
    x = torch.full((1, 11), 3)
    a = kw["model"](x)[0, 2]
    x[0, 4] = 7
    print(f"  changing token 4 changes the output at position 2: {not torch.allclose(a, kw['model'](x)[0, 2])}")


def flow_no_permutation_between_couplings():
    kw = _kw("flow_no_permutation_between_couplings")
    x = torch.randn(4, 2)
    z, _ = kw["model"](x)
    print(f"  first coordinate unchanged by the flow: {torch.allclose(z[:, 0], x[:, 0])}")


def flow_logdet_sign_flipped():
    print("  loss = -(log p(z) - logdet): change of variables requires + logdet")


def cvae_labels_off_by_one():
    kw = _kw("cvae_labels_off_by_one")
    ds = kw["train_loader"].dataset
    print(f"  label returned with row 0: {ds[0][1].item()}, row 0's own label: {ds.y[0].item()}")


def mdn_inputs_sorted_without_targets():
    kw = _kw("mdn_inputs_sorted_without_targets")
    x, t = kw["train_loader"].dataset.tensors
    print(f"  corr(x, t) in the training pairs: {torch.corrcoef(torch.cat([x, t], 1).T)[0, 1]:.3f} "
          f"(the true relation is strongly positive)")


def cvae_subset_from_label_sorted_order():
    kw = _kw("cvae_subset_from_label_sorted_order")
    ys = torch.cat([b[1] for b in kw["train_loader"]])
    print(f"  classes seen by the sampler: {ys.unique().tolist()}")


def flow_dequant_noise_wrong_scale():
    kw = _kw("flow_dequant_noise_wrong_scale")
    ds = kw["train_loader"].dataset
    print(f"  std of the noise added to one row over 200 draws: "
          f"{torch.stack([ds[0][0] for _ in range(200)]).std(0).tolist()}")


def cvae_collate_relabels_per_batch():
    kw = _kw("cvae_collate_relabels_per_batch")
    ds = kw["train_loader"].dataset
    batch = kw["train_loader"].collate_fn([ds[i] for i in range(6)])
    print(f"  true labels {ds.tensors[1][:6].tolist()} -> collated {batch[1].tolist()}")


load_all()
for _name in FIXES:
    _fn = globals().get(_name)
    FIXES[_name]["fact"] = _fn if _fn is not None else _shift(_name)
