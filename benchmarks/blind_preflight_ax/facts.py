"""Facts behind set ax's broken cases (no preflight): per case a function printing the fact the bug rests on, and
the fix each case is trained next to in ``verify.py`` (the fixed builder and the case's own metric)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_ax import (
    cases_data as D,
)
from benchmarks.blind_preflight_ax import (
    cases_mechanics as M,
)
from benchmarks.blind_preflight_ax import (
    cases_shapes as S,
)
from benchmarks.blind_preflight_ax import (
    cases_targets as T,
)
from benchmarks.blind_preflight_ax import (
    cases_trained as W,
)
from benchmarks.blind_preflight_ax.registry import acc_of, fix, fixed_of, mean_over, recall_at_1, top1_metric


def _ctr(m, b):
    return (m(b[0], b[1]) > 0).float(), b[2]


def _bin(m, b):
    return (m(b[0]) > 0).float(), b[1]


CTR_ACC, BIN_ACC = acc_of(_ctr), acc_of(_bin)


def fact_scores_view():
    flat = torch.tensor([0, 1, 2, 10, 11, 12])            # query-major scores of 2 queries x 3 documents (10*q + d)
    print("  view(Q, D):", flat.view(2, 3).tolist(), "| view(D, Q).t():", flat.view(3, 2).t().tolist())


def fact_stacked():
    e = torch.arange(3 * 2).reshape(3, 2, 1)        # fields x batch x 1: sample b of field f = 10 * b + f
    e = (torch.arange(2)[None, :, None] * 10 + torch.arange(3)[:, None, None]).expand(3, 2, 1)
    print("  stacked (fields, batch, 1) reshaped to (batch, -1):", e.reshape(2, -1).tolist(),
          "(row 0 should be [0, 1, 2])")


def fact_listnet():
    q = torch.tensor([[0.0], [1.0], [2.0]])
    print("  queries q0,q1,q2 for 2 docs each: repeat ->", q.repeat(2, 1).view(3, 2).tolist(),
          "repeat_interleave ->", q.repeat_interleave(2, 0).view(3, 2).tolist())


def fact_triplets():
    rows = ["a0", "p0", "n0", "a1", "p1", "n1", "a2", "p2", "n2"]
    print("  chunk(3) of interleaved rows gives anchors", rows[:3], "positives", rows[3:6], "negatives", rows[6:])


def fact_two_tower():
    u, v = torch.randn(4, 3), torch.randn(4, 3)
    print("  (u @ v.T).sum(1) =", [round(a, 2) for a in (u @ v.t()).sum(1).tolist()],
          "vs row-wise", [round(a, 2) for a in (u * v).sum(1).tolist()])


def fact_rank_position():
    g = torch.tensor([4.0, 0.0, 2.0])
    pos = (-g).argsort(dim=0, stable=True).argsort(dim=0).float() + 1
    print("  grades", g.tolist(), "-> rank positions", pos.tolist(), "softmax target", torch.softmax(pos, 0).tolist())


def fact_pm1():
    z = torch.tensor([-5.0, 0.0, 5.0])
    print("  BCEWithLogits at target -1 for logits", z.tolist(), ":",
          [round(F.binary_cross_entropy_with_logits(a, torch.tensor(-1.0)).item(), 2) for a in z], "(no minimum)")


def fact_threshold():
    kw = T.targets_rating_threshold_off_by_one()
    y = torch.cat([b[1] for b in kw["train_loader"]])
    print("  fraction of positive training labels with (rating > 5):", y.mean().item())


def fact_pairwise():
    print("  label (g_i > g_j) = 1 is paired with logit s_j - s_i: BCE pushes s_j above s_i")


def fact_in_batch():
    print("  labels", torch.zeros(4, dtype=torch.long).tolist(), "vs diagonal positives", torch.arange(4).tolist())


def fact_frozen():
    e = nn.Embedding.from_pretrained(torch.randn(3, 2))
    print("  nn.Embedding.from_pretrained(...).weight.requires_grad =", e.weight.requires_grad)


def fact_resized():
    kw = W.trained_vocab_resized_after_optimizer()
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  model.embs[0].weight in the optimizer:", id(kw["model"].embs[0].weight) in ids)


def fact_missing():
    kw = W.trained_optimizer_misses_embeddings()
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  parameters not in the optimizer:", [n for n, p in kw["model"].named_parameters() if id(p) not in ids])


def fact_padding():
    bag = nn.EmbeddingBag(5, 2, mode="sum", padding_idx=0)
    print("  EmbeddingBag(padding_idx=0): bag [0, 3] equals bag [3]:",
          torch.equal(bag(torch.tensor([[0, 3]])), bag(torch.tensor([[3, 0]]))), "row 0:", bag.weight[0].tolist())


def fact_dict():
    m = W.WideDeep()
    print("  'parts.wide' in named_parameters:", any(n.startswith("parts") for n, _ in m.named_parameters()))


def fact_steplr():
    kw = M.mechanics_steplr_epochs_per_batch()
    for _ in range(210):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print("  LR after 210 batches:", kw["scheduler"].get_last_lr())


def fact_ranknet_sum():
    kw = M.mechanics_ranknet_sum_over_pairs()
    xb, gb = next(iter(kw["train_loader"]))
    i, j = torch.triu_indices(10, 10, 1)
    print("  pairs summed per batch:", int((gb[:, i] != gb[:, j]).sum()), "with SGD lr", 0.1)


def fact_bf16():
    ts = torch.tensor([1.7e9, 1.7e9 + 86400 * 30, 1.7e9 + 86400 * 59])
    print("  timestamps", ts.tolist(), "in bf16:", ts.bfloat16().float().tolist())


def fact_adam_l2():
    print("  Adam adds weight_decay * w to the gradient before normalising: rows with no data get a full-size step "
          "towards 0 every step")


def fact_batch_hard():
    print("  batch-hard mining on unnormalised embeddings: the loss is minimised at margin by collapse")


def fact_te():
    kw = D.data_target_encoding_in_fold_leak()
    x, y = kw["train_loader"].dataset.tensors
    xv, yv = kw["val_loader"].dataset.tensors
    print("  accuracy of (encoding > 0.5): train", round(((x[:, -1] > 0.5).float() == y).float().mean().item(), 3),
          "val", round(((xv[:, -1] > 0.5).float() == yv).float().mean().item(), 3))


def fact_label_enc():
    raw_tr, raw_va = torch.tensor([101, 205, 307]), torch.tensor([205, 307])
    print("  per-split encoding: train", torch.searchsorted(raw_tr.unique(), raw_tr).tolist(), "for", raw_tr.tolist(),
          "/ val", torch.searchsorted(raw_va.unique(), raw_va).tolist(), "for", raw_va.tolist())


def fact_hash():
    kw = D.data_hash_modulo_embedding_dim()
    ids = torch.cat([b[0] for b in kw["train_loader"]])
    print("  distinct hashed ids used:", ids.unique().numel(), "for 500 products")


def fact_scaler():
    kw = D.data_scaler_fitted_not_applied()
    x = torch.cat([b[0] for b in kw["train_loader"]])
    xv = torch.cat([b[0] for b in kw["val_loader"]])
    print("  train feature std", [round(v, 1) for v in x.std(0).tolist()], "val", [round(v, 2) for v in xv.std(0)
                                                                                    .tolist()])


def fact_no_positives():
    kw = D.data_random_batches_no_positives()
    yb = next(iter(kw["train_loader"]))[1]
    same = (yb[:, None] == yb[None, :]).float().sum(1) - 1
    print("  anchors with a positive in a batch of", len(yb), ":", int((same > 0).sum()))


def _top1_sq(m, x):
    return m(x).reshape(x.shape[0], x.shape[1])


def _auc(model, kw):
    """Validation AUC of the row-wise two-tower score on held-out liked / not-liked pairs."""
    u, i, y = kw["val_loader"].dataset.tensors
    with torch.no_grad():
        s = (model.u(u) * model.i(i)).sum(1)
    pos, neg = s[y > 0], s[y == 0]
    return (pos[:, None] > neg[None, :]).float().mean().item()


def _bf16_acc(model, kw):
    def fn(m, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            p = m(b[0]) > 0
        return (p.float() == b[1]).sum().item(), b[1].numel()
    return mean_over(model, kw["val_loader"], fn)


TOP1 = top1_metric(_top1_sq)


def _qd_top1(model, kw):
    def fn(m, b):
        s, g = m(b[0], b[1]), b[2]
        return (g.gather(1, s.argmax(1)[:, None]).squeeze(1) == g.max(1).values).sum().item(), g.shape[0]
    return mean_over(model, kw["val_loader"], fn)
for name, mod, metric, label, fact in [
    ("shapes_scores_view_document_major", S, top1_metric(lambda m, x: m(x)), "val top-1 best-grade rate", fact_scores_view),
    ("shapes_stacked_fields_reshape", S, CTR_ACC, "val accuracy", fact_stacked),
    ("shapes_query_features_repeat_not_interleave", S, _qd_top1, "val top-1 best-grade rate", fact_listnet),
    ("shapes_interleaved_triplets_chunked", S, recall_at_1(), "val recall@1", fact_triplets),
    ("shapes_two_tower_matmul_sum", S, CTR_ACC, "val accuracy", fact_two_tower),
    ("targets_rank_position_as_relevance", T, TOP1, "val top-1 best-grade rate", fact_rank_position),
    ("targets_pm1_labels_bce", T, CTR_ACC, "val accuracy", fact_pm1),
    ("targets_rating_threshold_off_by_one", T, BIN_ACC, "val accuracy (liked)", fact_threshold),
    ("targets_pairwise_sign_flipped", T, TOP1, "val top-1 best-grade rate", fact_pairwise),
    ("targets_in_batch_labels_zeros", T, _auc, "val AUC", fact_in_batch),
    ("trained_from_pretrained_frozen", W, CTR_ACC, "val accuracy", fact_frozen),
    ("trained_vocab_resized_after_optimizer", W, CTR_ACC, "val accuracy", fact_resized),
    ("trained_optimizer_misses_embeddings", W, CTR_ACC, "val accuracy", fact_missing),
    ("trained_padding_idx_real_category", W, CTR_ACC, "val accuracy", fact_padding),
    ("trained_wide_part_in_plain_dict", W, CTR_ACC, "val accuracy", fact_dict),
    ("mechanics_steplr_epochs_per_batch", M, CTR_ACC, "val accuracy", fact_steplr),
    ("mechanics_ranknet_sum_over_pairs", M, TOP1, "val top-1 best-grade rate", fact_ranknet_sum),
    ("mechanics_bf16_raw_timestamp", M, _bf16_acc, "val accuracy (bf16)", fact_bf16),
    ("mechanics_adam_l2_on_embeddings", M, CTR_ACC, "val accuracy", fact_adam_l2),
    ("mechanics_batch_hard_unnormalised_collapse", M, recall_at_1(), "val recall@1", fact_batch_hard),
    ("data_target_encoding_in_fold_leak", D, BIN_ACC, "val accuracy", fact_te),
    ("data_label_encoder_per_split", D, CTR_ACC, "val accuracy", fact_label_enc),
    ("data_hash_modulo_embedding_dim", D, CTR_ACC, "val accuracy", fact_hash),
    ("data_scaler_fitted_not_applied", D, BIN_ACC, "val accuracy", fact_scaler),
    ("data_random_batches_no_positives", D, recall_at_1(), "val recall@1", fact_no_positives),
]:
    builder = getattr(mod, name)
    fix(name, fixed_of(builder), metric, label, fact, steps=300)
