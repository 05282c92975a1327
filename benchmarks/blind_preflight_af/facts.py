"""The fact each broken case of set af rests on, printed by ``verify.py`` before the case is trained next to its fix
(attached to ``FIXES[name]["fact"]``; no preflight involved)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from benchmarks.blind_preflight_af import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_af.registry import FIXES, cindex


def fact(name):
    def attach(fn):
        FIXES[name]["fact"] = fn
        return fn
    return attach


@fact("af_pointcloud_reshape_not_transpose")
def _():
    pts = torch.arange(12.0).reshape(1, 4, 3)  # 4 points, xyz
    print("  point 0 xyz:", pts[0, 0].tolist(), "| reshape(B, 3, N)[:, :, 0]:", pts.reshape(1, 3, 4)[0, :, 0].tolist(),
          "| transpose(1, 2)[:, :, 0]:", pts.transpose(1, 2)[0, :, 0].tolist())


@fact("af_gnn_messages_to_source")
def _():
    adj = torch.zeros(1, 3, 3)
    adj[0, 0, 1] = adj[0, 0, 2] = 1  # 0 -> 1, 0 -> 2
    x = torch.tensor([[[1.0], [10.0], [100.0]]])
    print("  edges 0->1, 0->2; x = 1, 10, 100 | bmm(adj, x):", torch.bmm(adj, x).flatten().tolist(),
          "| bmm(adj^T, x):", torch.bmm(adj.transpose(1, 2), x).flatten().tolist())


@fact("af_field_embeddings_cat_dim0")
def _():
    es = [torch.tensor([[0.0], [1.0]]) + 10 * f for f in range(2)]  # field f, sample b -> 10 f + b
    print("  rows (10*field + sample) | cat(dim=1):", torch.cat(es, 1).tolist(),
          "| cat(dim=0).view(B, -1):", torch.cat(es, 0).view(2, -1).tolist())


@fact("af_gaussian_nll_broadcast")
def _():
    out, y = torch.zeros(64, 2), torch.zeros(64)
    print("  mu", tuple(out[:, :1].shape), "y", tuple(y.shape), "-> (y - mu)", tuple((y - out[:, :1]).shape))


@fact("af_ft_transformer_seq_first_attention")
def _():
    mha = nn.MultiheadAttention(8, 2)
    print("  nn.MultiheadAttention(...).batch_first =", mha.batch_first, "(inputs read as (seq, batch, embed))")


@fact("af_node_loss_without_train_mask")
def _():
    _, _, y, mask, _ = cases_targets.labelled_graphs(200, 11)
    print(f"  labelled nodes: {mask.float().mean():.2f}; share of stored labels equal to 0: {(y == 0).float().mean():.2f}")


@fact("af_pos_weight_inverted")
def _():
    _, y = cases_targets.fraud_rows(4000, 13)
    p = y.mean().item()
    print(f"  positives {p:.3f}; pos_weight n_pos/n_neg = {p / (1 - p):.3f}, n_neg/n_pos = {(1 - p) / p:.1f}")


@fact("af_ordinal_alphabetical_codes")
def _():
    print("  grade order:", cases_targets.GRADES, "| LabelEncoder classes_:", sorted(cases_targets.GRADES))


@fact("af_survival_censor_flag_as_event")
def _():
    x, t, c = cases_targets.survival_rows(3000, 17)
    risk = x @ torch.tensor([1.0, -0.8, 0.6, 0.0, 0.4, 0.0])
    print(f"  censored share {c.mean():.2f}; C-index of the true risk with event=1-censored "
          f"{cindex(risk[:800], t[:800], 1 - c[:800]):.3f}, with event=censored {cindex(risk[:800], t[:800], c[:800]):.3f}")


@fact("af_margin_ranking_target_flipped")
def _():
    crit = nn.MarginRankingLoss()
    print("  MarginRankingLoss(x1=2, x2=1, y=1) =", crit(torch.tensor([2.0]), torch.tensor([1.0]), torch.tensor([1.0])).item(),
          "| (x1=1, x2=2, y=1) =", crit(torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([1.0])).item())


@fact("af_padding_idx_real_category")
def _():
    emb = nn.Embedding(5, 3, padding_idx=0)
    emb(torch.tensor([0, 1])).sum().backward()
    uid, _, _ = cases_trained.ratings(4000, 21)
    print("  grad of row 0:", emb.weight.grad[0].tolist(), f"| share of rows from user 0: {(uid == 0).float().mean():.2f}")


@fact("af_optimizer_before_head_swap")
def _():
    kw = cases_trained.head_swap()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  model.head params in the optimizer:", [id(p) in in_opt for p in kw["model"].head.parameters()])


@fact("af_gcn_numpy_propagation")
def _():
    h = nn.Linear(2, 3)(torch.randn(1, 4, 2))
    out = cases_trained.numpy_propagate(torch.eye(4)[None], h)
    print("  after numpy propagation: requires_grad =", out.requires_grad, "grad_fn =", out.grad_fn)


@fact("af_from_pretrained_frozen_items")
def _():
    print("  nn.Embedding.from_pretrained(w).weight.requires_grad =",
          nn.Embedding.from_pretrained(torch.randn(3, 2)).weight.requires_grad)


@fact("af_set_encoder_under_no_grad")
def _():
    m = cases_trained.DeepSets(encode_without_grad=True)
    print("  embed_elements(x).requires_grad =", m.embed_elements(torch.randn(2, 4, 2)).requires_grad)


@fact("af_dropout_keep_prob")
def _():
    d = nn.Dropout(0.9).train()
    print(f"  nn.Dropout(0.9) zeroes {(d(torch.ones(10000)) == 0).float().mean():.2f} of the units")


@fact("af_adam_eps_one")
def _():
    for eps in (1.0, 1e-8):
        p = nn.Parameter(torch.zeros(1))
        opt = torch.optim.Adam([p], lr=1e-3, eps=eps)
        p.grad = torch.tensor([0.01])
        opt.step()
        print(f"  Adam(lr=1e-3, eps={eps:g}), grad 0.01: first step {abs(p.item()):.2e}")


@fact("af_warmup_lambda_unbounded")
def _():
    kw = cases_mechanics.warmup_unbounded()
    for _ in range(300):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print("  lr after 300 steps:", kw["optimizer"].param_groups[0]["lr"], "(base 0.02)")


@fact("af_sum_reduction_sgd")
def _():
    p, y = torch.zeros(128, 1, requires_grad=True), torch.ones(128, 1)
    g_sum = torch.autograd.grad(nn.MSELoss(reduction="sum")(p, y), p)[0].abs().sum()
    g_mean = torch.autograd.grad(nn.MSELoss()(p, y), p)[0].abs().sum()
    print(f"  |grad| sum-reduction / mean-reduction on a batch of 128: {g_sum / g_mean:.0f}")


@fact("af_cox_loss_unsorted")
def _():
    kw = cases_mechanics.cox_unsorted()
    _, t, _ = next(iter(kw["train_loader"]))
    print("  first batch times sorted descending?", bool((t[:-1] >= t[1:]).all()), "| first five:",
          [round(v, 3) for v in t[:5].tolist()])


@fact("af_raw_epoch_timestamp_feature")
def _():
    x, ts, _ = cases_data.meter_rows(3000, 41)
    print(f"  sensor column std {x.std(0).mean():.2f}; timestamp column mean {ts.mean():.3e}, std {ts.std():.3e}")


@fact("af_labelencoder_per_file")
def _():
    print("  code of 'st_15' in file 1:", int(cases_data.label_encode(["st_15"], cases_data.STATIONS)[0]),
          "| in file 2 (fit on st_10..st_29):", int(np.searchsorted(np.array(cases_data.STATIONS[10:]), "st_15")))


@fact("af_fm_shared_table_no_offsets")
def _():
    cats = torch.tensor([[3, 3, 3]])
    print("  ids of category 3 in fields 0..2 without offsets:", cats[0].tolist(),
          "| with offsets:", (cats + torch.tensor([0, 20, 40]))[0].tolist())


@fact("af_node_table_string_sorted")
def _():
    print("  row order of a table keyed by str(id):", cases_data.string_sorted()[:6], "...")


@fact("af_window_labels_ignore_stride")
def _():
    win, stride = 32, 8
    print("  window 50 covers samples", 50 * stride, "..", 50 * stride + win - 1, "| label index used:", 50 + win - 1)


_ = (math, cases_shapes)
