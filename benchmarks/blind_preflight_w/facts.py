"""The fact each broken case of set w rests on, printed by ``verify.py`` before the case is trained next to its fix
(shapes, values, what a step changes), attached to ``FIXES`` here. No preflight involved."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_w import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_w.registry import FIXES, load_all

load_all()


def _edge_view():
    edges = torch.tensor([[0, 1], [0, 2], [1, 0], [2, 0]])
    print("  (E, 2) edges", edges.tolist(), "-> .view(2, -1)", edges.view(2, -1).tolist(), "vs .t()",
          edges.t().tolist())


def _readout():
    kw = cases_shapes.build_pool_batch_mean()
    x, ei, b, y = next(iter(kw["train_loader"]))
    out = kw["model"](x, ei, b)
    print(f"  {int(b.max()) + 1} graphs in a batch, distinct output rows: {torch.unique(out.detach(), dim=0).size(0)}")


def _kl_dim():
    mu, logvar = torch.randn(128, 8), torch.zeros(128, 8)
    kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp())
    print(f"  KL per sample (sum dim=1, mean): {kl.sum(1).mean():.2f}; as written (sum dim=0, mean): "
          f"{kl.sum(0).mean():.2f} = x{kl.sum(0).mean() / kl.sum(1).mean():.0f}")


def _ab_broadcast():
    ab, x0 = torch.rand(32), torch.ones(32, 32)
    out = ab * x0
    print(f"  (32,) * (32, 32) -> {tuple(out.shape)}; sample 0's scale varies along its bins: "
          f"{[round(v, 3) for v in out[0, :4].tolist()]} = ab[:4] of samples 0-3")


def _mil_softmax():
    a = torch.randn(4, 12, 1)
    print("  softmax(dim=0) weights per bag sum to", a.softmax(0).sum(1).flatten().tolist(),
          "; dim=1:", a.softmax(1).sum(1).flatten().tolist())


def _simclr_self():
    z = F.normalize(torch.randn(8, 16), dim=1)
    logits = z @ z.T / 0.2
    print(f"  labels=arange: target logit is the diagonal, {logits.diag()[0]:.1f} = 1/temperature, its gradient "
          "through z.z is 0 (constant norm)")


def _bce_mean():
    x = (torch.rand(64, 100) < 0.3).float()
    p = torch.full_like(x, 0.3)
    print(f"  BCE mean {F.binary_cross_entropy(p, x):.3f} vs per-sample sum {F.binary_cross_entropy(p, x, reduction='sum') / 64:.1f}"
          " - the KL (summed over 10 latents) is weighed against the first")


def _dae():
    clean = cases_targets.traces(200, 1)
    noisy = clean + 0.5 * torch.randn_like(clean)
    print(f"  identity on the noisy input: MSE to clean {F.mse_loss(noisy, clean):.3f}, MSE to the training target "
          f"(noisy) {F.mse_loss(noisy, noisy):.3f}")


def _gan_labels():
    logits = torch.tensor([[3.0]])
    print(f"  generator term with zeros: loss {F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits)):.2f} "
          "when D calls the sample real - minimising it makes samples look fake")


def _unlabelled():
    kw = cases_targets.build_unlabeled_as_zero()
    _, _, y, m = next(iter(kw["train_loader"]))
    print(f"  nodes in the loss: {int(m.sum())}, of which label 0: {int((y[m] == 0).sum())}")


def _disc_params():
    kw = cases_trained.build_disc_not_optimized()
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    d = list(kw["model"].discriminator.parameters())
    print(f"  discriminator tensors in the optimizer: {sum(id(p) in ids for p in d)}/{len(d)}")


def _mask():
    kw = cases_trained.build_flow_same_mask()
    print("  coupling masks:", [layer.mask.tolist() for layer in kw["model"].layers])


def _self_loops():
    kw = cases_trained.build_no_self_loops()
    x, ei, _, _ = next(iter(kw["train_loader"]))
    isolated = int((torch.bincount(ei[1], minlength=x.size(0)) == 0).sum())
    print(f"  nodes with no incoming edge: {isolated}/{x.size(0)}; without self-loops their aggregate is all zeros")


def _frozen():
    e = nn.Embedding.from_pretrained(torch.randn(3, 4))
    print(f"  nn.Embedding.from_pretrained(...).weight.requires_grad = {e.weight.requires_grad}")


def _sequential():
    block = cases_trained.TimeResBlock(8)
    seq = nn.Sequential(block)
    seen = {}

    def record(module, args):
        seen["n_args"] = len(args)

    block.register_forward_pre_hook(record)
    seq(torch.randn(2, 8))
    print(f"  nn.Sequential calls a block with {seen['n_args']} positional argument(s): temb stays None")


def _warmup():
    f = lambda step: (step + 1) / 10  # noqa: E731
    print(f"  LR multiplier at steps 10, 100, 300: {f(9):.0f}, {f(99):.0f}, {f(299):.0f}")


def _stopgrad():
    z = torch.randn(4, 8, requires_grad=True)
    loss = -F.cosine_similarity(z, z, dim=-1).mean()
    print(f"  the collapsed solution p = z gives the minimum loss {loss.item():.2f}; without .detach() both sides move")


def _anneal():
    kw = cases_mechanics.build_anneal_in_samples()
    print(f"  warm-up steps {kw['loss_fn'].warmup_steps} (batches per epoch {len(kw['train_loader'])}); "
          f"beta after 300 steps: {min(1.0, 300 / kw['loss_fn'].warmup_steps):.3f}")


def _eps():
    g = torch.full((1,), 1e-3)
    v = g**2
    print(f"  Adam step / lr with |grad| = 1e-3: eps=1e-8 -> {(g / (v.sqrt() + 1e-8)).item():.3f}, "
          f"eps=1.0 -> {(g / (v.sqrt() + 1.0)).item():.5f}")


def _accum():
    print(f"  loop divides by accumulation_steps={cases_mechanics.ACCUM}, loss_fn divides again: gradient x "
          f"1/{cases_mechanics.ACCUM}; SGD has no per-parameter normalisation to undo it")


def _offset():
    kw = cases_data.build_collate_no_offset()
    x, ei, b, _ = next(iter(kw["train_loader"]))
    first = int((b == 0).sum())
    print(f"  nodes in graph 0: {first}; max edge index {int(ei.max())}; edges touching graphs 1+: "
          f"{int((ei[1] >= first).sum())}/{ei.size(1)}")


def _codes():
    _, codes_tr = cases_data.cat_codes(np.array(["R00", "R03", "R05"]))
    _, codes_va = cases_data.cat_codes(np.array(["R03", "R05"]))
    print(f"  R03 -> {codes_tr[1]} in train, {codes_va[0]} in validation")


def _sentinel():
    x, _ = cases_data.loan_rows(4000, 231)
    filled = np.nan_to_num(x[:, 0], nan=-999.0)
    print(f"  income std after fillna(-999): {filled.std():.0f}; real incomes after scaling span "
          f"{np.ptp(((filled - filled.mean()) / filled.std())[~np.isnan(x[:, 0])]):.4f}")


def _target_encoding():
    m, _, y = cases_data.fraud_rows(4000, 2500, 242)
    means, counts = cases_data.group_mean(m, y.astype(float), 2500, y.mean())
    enc = means[m]
    print(f"  rows whose merchant has 1 training row: {(counts[m] == 1).mean():.0%}; accuracy of (encoding > 0.5) "
          f"on train: {((enc > 0.5) == y).mean():.2f}")


def _views():
    x, _, q = cases_data.view_data(4, 6, 8, 24, 2.0, s=1)
    ds = cases_data.TwoViewWindows(x, q, fixed=False)
    v1, v2 = ds[0]
    print(f"  view1 == view2: {torch.equal(v1, v2)}")


FACTS = {
    "gnn_edge_list_view": _edge_view, "graph_readout_whole_batch": _readout, "vae_kl_summed_over_batch": _kl_dim,
    "ddpm_alpha_bar_broadcast": _ab_broadcast, "mil_attention_softmax_over_bags": _mil_softmax,
    "simclr_positive_is_self": _simclr_self, "vae_bce_mean_kl_sum": _bce_mean,
    "dae_reconstructs_noisy_input": _dae, "gan_generator_fake_labels": _gan_labels,
    "gcn_unlabelled_nodes_as_class0": _unlabelled, "gan_discriminator_not_in_optimizer": _disc_params,
    "realnvp_mask_never_flips": _mask, "gcn_without_self_loops": _self_loops,
    "store_embedding_from_pretrained_frozen": _frozen, "denoiser_sequential_drops_timestep": _sequential,
    "warmup_lambda_never_caps": _warmup, "simsiam_missing_stop_gradient": _stopgrad,
    "kl_warmup_counted_in_samples": _anneal, "adam_epsilon_one_from_tf": _eps,
    "sgd_loss_divided_by_accumulation_twice": _accum, "graph_collate_edges_not_offset": _offset,
    "category_codes_refit_on_validation": _codes, "sentinel_fill_before_scaler": _sentinel,
    "target_encoding_leaks_own_label": _target_encoding, "contrastive_views_seeded_by_index": _views,
}

for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
