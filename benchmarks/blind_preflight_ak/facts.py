"""The fact each broken case of set ak rests on, printed by ``verify.py`` before the case trains next to its fix
(no preflight involved). Importing this module attaches each function to ``FIXES[name]["fact"]``."""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.blind_preflight_ak import cases_data as D
from benchmarks.blind_preflight_ak import cases_mechanics as M
from benchmarks.blind_preflight_ak import cases_shapes as S  # noqa: I001  (family order)
from benchmarks.blind_preflight_ak import cases_targets as T
from benchmarks.blind_preflight_ak import cases_trained as W
from benchmarks.blind_preflight_ak.registry import FIXES

FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        return fn
    return register


@fact("ak_seq2seq_flat_seqfirst_targets")
def _():
    kw = S.seq2seq_flat()
    src, tgt = next(iter(kw["train_loader"]))
    print(f"  logits {tuple(kw['model'](src).shape)}, targets {tuple(tgt.shape)}: both flatten to {tgt.numel()}")


@fact("ak_rec_dot_sum_without_dim")
def _():
    u, v = torch.randn(4, 8), torch.randn(4, 8)
    print(f"  (u * v).sum() shape {tuple((u * v).sum().shape)}, (u * v).sum(1) shape {tuple((u * v).sum(1).shape)}")


@fact("ak_bigru_hn_view_batch")
def _():
    h = torch.arange(2 * 4).float().reshape(2, 4, 1).expand(2, 4, 2)   # value = direction*4 + sample
    print("  h_n.view(4, -1) row 0 holds states", h.reshape(4, -1)[0].tolist(), "(sample 0 and 1, forward only)")


@fact("ak_seg_view_nchw_as_nhwc")
def _():
    logits = torch.arange(2 * 4).float().reshape(1, 2, 2, 2)            # C=2, value = c*4 + pixel
    print("  view(-1, 2) row 0:", logits.view(-1, 2)[0].tolist(), "permute row 0:",
          logits.permute(0, 2, 3, 1).reshape(-1, 2)[0].tolist())


@fact("ak_mha_heads_view_no_transpose")
def _():
    x = torch.arange(4).repeat_interleave(4).float().reshape(1, 4, 4)    # token id in every feature
    print("  tokens in head 0 after reshape(B, 2, S, 2):", x.reshape(1, 2, 4, 2)[0, 0, :, 0].tolist())


@fact("ak_mse_mean_then_square")
def _():
    err = torch.tensor([2.0, -2.0, 1.0, -1.0])
    print(f"  errors {err.tolist()}: mean()**2 = {err.mean() ** 2:.1f}, (err**2).mean() = {(err ** 2).mean():.1f}")


@fact("ak_labels_factorized_per_shard")
def _():
    print("  factorize(['refund','billing']) ->", T.factorize(["refund", "billing"]).tolist(),
          "; factorize(['billing','refund']) ->", T.factorize(["billing", "refund"]).tolist())


@fact("ak_mask_0_255_bce")
def _():
    z = torch.tensor([5.0, 20.0])
    print("  BCEWithLogits(z, 255) for z=5, 20:",
          [round(torch.nn.functional.binary_cross_entropy_with_logits(v, torch.tensor(255.0)).item(), 1) for v in z])


@fact("ak_teacher_forcing_no_shift")
def _():
    t = torch.tensor([[3, 7, 1]])
    print(f"  target {t.tolist()}, decoder input (broken) {t.tolist()}, shifted {T.shift_right(t).tolist()}")


@fact("ak_pos_weight_inverted")
def _():
    y = T.fraud(4000, s=11)[1][:3000]
    print(f"  positives {int(y.sum())}/3000: n_pos/n_neg = {y.sum() / (1 - y).sum():.3f}, "
          f"n_neg/n_pos = {(1 - y).sum() / y.sum():.1f}")


@fact("ak_head_replaced_after_optimizer")
def _():
    kw = W.head_after()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  new fc weight in optimizer:", id(kw["model"].fc.weight) in in_opt)


@fact("ak_freeze_slice_leaves_bias_only")
def _():
    kw = W.freeze_slice()
    print("  trainable:", [tuple(p.shape) for p in kw["model"].parameters() if p.requires_grad])


@fact("ak_param_groups_skip_pos_embed")
def _():
    kw = W.groups_pos()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  not in any group:", [n for n, p in kw["model"].named_parameters() if id(p) not in in_opt])


@fact("ak_numpy_clip_in_forward")
def _():
    m = W.DemandForecaster()
    m(torch.randn(4, 24)).sum().backward()
    print("  grad of net[0].weight:", m.net[0].weight.grad, "; grad of scale:", m.scale.grad is not None)


@fact("ak_item_factors_register_buffer")
def _():
    m = W.ItemTowerMF()
    print("  parameters:", [n for n, _ in m.named_parameters()], "buffers:", [n for n, _ in m.named_buffers()])


@fact("ak_warmup_counted_in_rows")
def _():
    kw = M.warmup_rows()
    for _ in range(300):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print(f"  LR after 300 steps: {kw['optimizer'].param_groups[0]['lr']:.4f} of peak 0.1 "
          f"(max_steps {kw['max_steps']})")


@fact("ak_pure_bf16_weights")
def _():
    w = torch.tensor(0.1, dtype=torch.bfloat16)
    print(f"  bf16 0.1 - 1e-4 == 0.1: {bool(w - 1e-4 == w)}")


@fact("ak_dropout_keep_prob_habit")
def _():
    d = torch.nn.Dropout(0.9)
    print(f"  nn.Dropout(0.9) keeps {(d(torch.ones(10000)) != 0).float().mean():.2f} of the units")


@fact("ak_init_constant_weights")
def _():
    kw = M.init_const()
    print("  distinct rows in the first weight:", torch.unique(kw["model"][0].weight, dim=0).shape[0])


@fact("ak_batchnorm_microbatch_of_two")
def _():
    bn = torch.nn.BatchNorm1d(3)
    print("  BatchNorm1d on 2 rows ->", bn(torch.randn(2, 3)).detach().round(decimals=2).tolist())


@fact("ak_standardise_wrong_axis")
def _():
    raw, _ = D.loan_table(5, s=22)
    x = (raw - raw.mean(1, keepdim=True)) / raw.std(1, keepdim=True)
    print("  row-standardised features 2..7 of row 0:", x[0, 2:].round(decimals=3).tolist())


@fact("ak_last_step_of_padded_batch")
def _():
    tokens, lengths, _ = D.reviews(4, s=23)
    print("  lengths", lengths.tolist(), "; last column tokens", tokens[:, -1].tolist())


@fact("ak_flip_image_not_mask")
def _():
    print("  RandomHorizontalFlip on the image alone: p=0.5 of the pairs misaligned")


@fact("ak_uint8_centring_wraps")
def _():
    a = torch.tensor([120, 130], dtype=torch.uint8)
    print("  uint8 [120, 130] - 128 ->", (a - 128).tolist(), "; numpy:", (np.array([120, 130], np.uint8) - np.uint8(128)).tolist())


@fact("ak_getitem_normalises_in_place")
def _():
    kw = D.inplace_norm()
    ds = kw["train_loader"].dataset
    stds = []
    for _ in range(3):
        for i in range(len(ds)):
            ds[i]
        stds.append(round(ds.x.std().item(), 4))
    print("  stored data std after epochs 1-3:", stds)


for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
