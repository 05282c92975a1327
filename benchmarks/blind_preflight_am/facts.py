"""The fact each broken case of set am rests on, printed by ``verify.py`` before the broken and fixed runs (no
preflight involved). Importing this module attaches each function to ``FIXES[name]["fact"]``."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from benchmarks.blind_preflight_am import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_am.registry import FIXES


def fact(name):
    def register(fn):
        FIXES[name]["fact"] = fn
        return fn
    return register


def first_batch(kw):
    return next(iter(kw["train_loader"]))


@fact("am_horizon_target_extra_dim")
def _horizon():
    kw = cases_shapes.horizon_target_extra_dim()
    x, y = first_batch(kw)
    out = kw["model"](x)
    print(f"  fact: output {tuple(out.shape)}, target {tuple(y.shape)}, broadcast "
          f"{tuple(torch.broadcast_shapes(out.shape, y.shape))}")


@fact("am_conv1d_view_not_permute")
def _conv1d():
    x = torch.arange(4 * 3).reshape(1, 4, 3).float()   # (batch, time=4, features=3)
    print(f"  fact: view(b, f, t) channel 0 = {x.view(1, 3, 4)[0, 0].tolist()}, "
          f"permute channel 0 = {x.permute(0, 2, 1)[0, 0].tolist()} (feature 0 over time)")


@fact("am_mf_dot_sum_no_dim")
def _mf():
    kw = cases_shapes.mf_dot_sum_no_dim()
    x, _ = first_batch(kw)
    m = kw["model"]
    print(f"  fact: (u * v).sum() has shape {tuple((m.user(x[:, 0]) * m.item(x[:, 1])).sum().shape)}; "
          f"with dim=1: {tuple((m.user(x[:, 0]) * m.item(x[:, 1])).sum(dim=1).shape)}")


@fact("am_gru_hn_view_mixes_batch")
def _gru():
    h = torch.arange(2 * 3).reshape(2, 3, 1).float()      # (num_layers=2, batch=3, hidden=1): value = layer*3 + b
    print(f"  fact: h_n.view(3, -1) rows {h.view(3, -1).tolist()} vs permute rows "
          f"{h.permute(1, 0, 2).reshape(3, -1).tolist()}")


@fact("am_lstm_window_seq_first")
def _lstm():
    lstm = nn.LSTM(1, 1)
    x = torch.zeros(4, 5, 1)
    x[0] = 1.0                                            # perturb sample 0 only
    out_a, _ = lstm(x)
    out_b, _ = lstm(torch.zeros(4, 5, 1))
    print(f"  fact: batch_first={lstm.batch_first}; changing sample 0 changes out[:, -1] of samples "
          f"{[(i) for i in range(4) if not torch.allclose(out_a[i, -1], out_b[i, -1])]}")


@fact("am_unscaled_price_target")
def _price():
    kw = cases_targets.unscaled_price_target()
    x, y = first_batch(kw)
    print(f"  fact: target mean {y.mean():.3g}, std {y.std():.3g}; initial outputs mean {kw['model'](x).mean():.3g}")


@fact("am_window_label_is_last_input")
def _window():
    kw = cases_targets.window_label_is_last_input()
    x, y = first_batch(kw)
    print(f"  fact: label == last input value in {(y == x[:, -1]).float().mean():.0%} of the training windows")


@fact("am_cox_risk_set_ascending")
def _cox():
    t = torch.tensor([1.0, 2.0, 3.0])
    print(f"  fact: ascending order {torch.argsort(t).tolist()}: logcumsumexp at the earliest event sums over 1 "
          f"subject (itself) instead of all 3 still at risk")


@fact("am_pos_weight_inverted")
def _pos_weight():
    kw = cases_targets.pos_weight_inverted()
    print(f"  fact: pos_weight = {kw['loss_fn'].pos_weight.item():.3f}")


@fact("am_pinball_quantile_swapped")
def _pinball():
    y = torch.randn(20000)
    q = torch.zeros((), requires_grad=True)
    opt = torch.optim.SGD([q], lr=0.05)
    for _ in range(400):
        opt.zero_grad()
        err = y - q
        torch.maximum(0.1 * err, -0.9 * err).mean().backward()
        opt.step()
    print(f"  fact: the swapped loss at q=0.9 minimises at {q.item():.2f} on N(0,1) (P10 = -1.28, P90 = +1.28)")


@fact("am_padding_idx_real_item")
def _padding():
    kw = cases_trained.padding_idx_real_item()
    x, _ = first_batch(kw)
    print(f"  fact: item 0 is {(x[:, 1] == 0).float().mean():.0%} of a batch; its embedding row "
          f"{kw['model'].item.weight[0].abs().sum().item():.1f} (all zero, no gradient)")


@fact("am_sparse_adam_only_embeddings")
def _sparse():
    kw = cases_trained.sparse_adam_only_embeddings()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    names = [n for n, p in kw["model"].named_parameters() if id(p) not in in_opt]
    print(f"  fact: parameters not in the optimizer: {names}")


@fact("am_from_pretrained_frozen_items")
def _frozen():
    e = nn.Embedding.from_pretrained(torch.randn(3, 2))
    print(f"  fact: nn.Embedding.from_pretrained(...).weight.requires_grad = {e.weight.requires_grad}")


@fact("am_numpy_in_forward")
def _numpy():
    kw = cases_trained.numpy_in_forward()
    x, y = first_batch(kw)
    nn.functional.cross_entropy(kw["model"](x), y).backward()
    print(f"  fact: encoder first-layer grad is {kw['model'].encoder[0].weight.grad}")


@fact("am_loss_rewrapped_tensor")
def _rewrapped():
    kw = cases_trained.loss_rewrapped_tensor()
    loss = kw["loss_fn"](kw["model"], first_batch(kw))
    print(f"  fact: loss.grad_fn = {loss.grad_fn}, is_leaf = {loss.is_leaf}")


@fact("am_bf16_large_offset_target")
def _bf16():
    v = torch.tensor([5000.0, 5010.0, 5020.0, 5030.0])
    print(f"  fact: {v.tolist()} in bfloat16 -> {v.bfloat16().float().tolist()}")


@fact("am_loss_divided_twice_accum")
def _accum():
    print(f"  fact: loss_fn returns mean / {cases_mechanics.ACCUM} and accumulation_steps={cases_mechanics.ACCUM} "
          f"divides again: gradient x 1/{cases_mechanics.ACCUM}")


@fact("am_lambdalr_returns_lr")
def _lambdalr():
    kw = cases_mechanics.lambdalr_returns_lr()
    for _ in range(100):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print(f"  fact: lr after 100 steps = {kw['optimizer'].param_groups[0]['lr']:.2e}")


@fact("am_bn_keras_momentum")
def _bn():
    bn = nn.BatchNorm1d(1, momentum=0.99)
    bn(torch.randn(64, 1) * 3 + 10)
    bn(torch.zeros(16, 1) + torch.randn(16, 1))
    print(f"  fact: after a batch of mean 10 then one of mean ~0, running_mean = {bn.running_mean.item():.2f}")


@fact("am_sum_reduction_sgd")
def _sum():
    a, b = torch.randn(256), torch.randn(256)
    print(f"  fact: sum / mean MSE ratio = {(nn.MSELoss(reduction='sum')(a, b) / nn.MSELoss()(a, b)).item():.0f}")


@fact("am_sampler_weights_per_class")
def _sampler():
    kw = cases_data.sampler_weights_per_class()
    print(f"  fact: sampler weights length {len(kw['train_loader'].sampler.weights)}, drawn indices "
          f"{sorted(set(list(kw['train_loader'].sampler)))[:5]}")


@fact("am_category_codes_refit_val")
def _codes():
    st, _, _, sv, _, _ = cases_data.store_sales(42)
    tr, _ = np.unique(st, return_inverse=True)
    first = sv[0]
    print(f"  fact: store {first}: train code {np.searchsorted(tr, first)}, val refit code "
          f"{np.unique(sv, return_inverse=True)[1][0]}")


@fact("am_shuffle_before_windowing")
def _shuffle():
    for fixed in (False, True):
        kw = cases_data.shuffle_before_windowing(fixed)
        x, y = kw["train_loader"].dataset.tensors
        c = torch.corrcoef(torch.stack([x[:, -1], y]))[0, 1].item()
        print(f"  fact: {'fixed' if fixed else 'broken'}: corr(last input, target) = {c:.2f}")


@fact("am_target_encoding_own_row")
def _te():
    for fixed in (False, True):
        kw = cases_data.target_encoding_own_row(fixed)
        x, y = kw["train_loader"].dataset.tensors
        xv, yv = kw["val_loader"].dataset.tensors
        ct = torch.corrcoef(torch.stack([x[:, 0], y]))[0, 1].item()
        cv = torch.corrcoef(torch.stack([xv[:, 0], yv]))[0, 1].item()
        print(f"  fact: {'fixed' if fixed else 'broken'}: corr(encoding, target) train {ct:.2f}, val {cv:.2f}")


@fact("am_sampler_plus_class_weights")
def _double():
    kw = cases_data.sampler_plus_class_weights()
    _, y = first_batch(kw)
    w = kw["loss_fn"].weight
    print(f"  fact: batch positive share {y.float().mean():.2f} (sampler) and loss weights {w.tolist()}: "
          f"positives count {(y.float().mean() * w[1] / ((1 - y.float().mean()) * w[0])).item():.0f}x negatives")
