"""The fact each broken case of set au rests on, printed without the preflight; attached to FIXES[name]['fact']."""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_au import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_au.registry import FIXES


def _first(builder):
    kw = builder()
    return kw, next(iter(kw["train_loader"]))


def focal_binary():
    kw, (x, y) = _first(cases_shapes.focal_binary_n1_vs_n)
    out = kw["model"](x)
    print(f"logits {tuple(out.shape)} * targets {tuple(y.shape)} -> {tuple((out * y).shape)}")


def kd_time():
    t = torch.randn(2, 12, 6)
    print("softmax(dim=1) sums over classes:", F.softmax(t, 1).sum(-1)[0, :3].tolist(), "(not 1)")


def ml_view():
    c = torch.stack([torch.tensor([1, 0, 0]), torch.tensor([0, 1, 1])])  # (C=2, N=3)
    print("view(N, C):", c.view(3, 2).tolist(), "vs .t():", c.t().tolist())


def ord_broadcast():
    print("SmoothL1 (N,1) vs (N,) ->", tuple((torch.zeros(64, 1) - torch.zeros(64)).shape))


def weight_broadcast():
    print("(N,) * (N,1) ->", tuple((torch.zeros(64) * torch.zeros(64, 1)).shape))


def counter_order():
    print("Counter over severity-sorted labels:", list(Counter([2, 2, 1, 1, 1, 0, 0, 0, 0]).keys()), "(class order 2,1,0)")


def pos_weight():
    print("n_pos/n_neg at 5% positives:", round(0.05 / 0.95, 3), "vs n_neg/n_pos:", round(0.95 / 0.05, 1))


def ml_ce():
    z = torch.tensor([[2.0, 2.0, -1.0]])
    print("CE is shift-invariant: loss(z) == loss(z - 5):",
          torch.allclose(F.cross_entropy(z, torch.tensor([[1.0, 1.0, 0.0]])),
                         F.cross_entropy(z - 5, torch.tensor([[1.0, 1.0, 0.0]]))), "-> sigmoid(z) > 0.5 undetermined")


def coral():
    y = torch.tensor([0, 2, 4])
    print("y >= k:", (y.unsqueeze(1) >= torch.arange(4)).sum(1).tolist(), "decoded vs true", y.tolist())


def standardized():
    kw = cases_targets.threshold_on_standardized_column()
    ys = torch.cat([b[1] for b in kw["train_loader"]])
    print("positive training labels:", int(ys.sum()), "of", len(ys))


def teacher_opt():
    kw = cases_trained.kd_teacher_in_optimizer()
    n = sum(p.numel() for g in kw["optimizer"].param_groups for p in g["params"])
    print("params in optimizer", n, "of which teacher", sum(p.numel() for p in kw["model"].teacher.parameters()))


def head_opt():
    kw = cases_trained.head_replaced_after_optimizer()
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("new head params in optimizer:", any(id(p) in ids for p in kw["model"].head.parameters()))


def substring():
    kw = cases_trained.freeze_by_substring_hits_student()
    print("student trainable:", [n for n, p in kw["model"].student.named_parameters() if p.requires_grad])


def cutpoints():
    kw = cases_trained.ordinal_cutpoints_plain_tensor()
    print("parameters named:", [n for n, _ in kw["model"].named_parameters()], "(no cutpoints)")


def nograd():
    with torch.no_grad():
        s = nn.Linear(2, 2)(torch.randn(3, 2))
    print("student output in no_grad requires_grad:", s.requires_grad)


def kl_mean():
    a, b = F.log_softmax(torch.randn(8, 50), 1), F.softmax(torch.randn(8, 50), 1)
    print("KLDivLoss mean / batchmean:", round((nn.KLDivLoss()(a, b) / nn.KLDivLoss(reduction="batchmean")(a, b)).item(), 4))


def rampup():
    loss = cases_mechanics.RampedDistill(None, 44, 80)
    loss.calls = 300
    print("weight after 300 steps with 80-epoch ramp-up:", round(loss.weight(), 4))


def focal_max():
    p = torch.tensor([[0.97, 0.02, 0.01]])
    print("wrong minority row (target 2): (1 - max p)^2 =", round((1 - p.max()).item() ** 2, 4),
          "vs (1 - p[2])^2 =", round((1 - p[0, 2]).item() ** 2, 4))


def lr_batch():
    kw = cases_mechanics.exp_lr_per_batch()
    for _ in range(100):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print("lr after 100 steps:", kw["scheduler"].get_last_lr())


def ema():
    print("share of init left in EMA after 300 steps: 0.9999 ->", round(0.9999 ** 300, 3), "; 0.99 ->",
          round(0.99 ** 300, 3))


def sampler_class():
    kw = cases_data.sampler_class_weights_not_per_sample()
    print("indices drawn:", sorted(set(list(iter(kw["train_loader"].sampler)))))


def sampler_counts():
    kw = cases_data.sampler_weights_counts_not_inverse()
    ys = torch.cat([b[1] for b in kw["train_loader"]])
    print("drawn class counts:", torch.bincount(ys, minlength=3).tolist())


def views():
    ds = cases_data.TwoViews(torch.zeros(2, 3), torch.zeros(2).long(), torch.randn(50, 3), False, s=1)
    print("mean |weak - strong| (different rows):", round((ds.weak - ds.strong).abs().mean().item(), 2))


def cached():
    kw = cases_data.kd_cached_logits_misaligned()
    x, lg = kw["train_loader"].dataset.tensors
    t = cases_data.oracle_teacher(12, 6, s=80)
    with torch.no_grad():
        print("cached argmax == teacher(x) argmax:", round((t(x).argmax(1) == lg.argmax(1)).float().mean().item(), 3))


def pseudo():
    kw = cases_data.pseudo_labels_from_untrained_model()
    ds = kw["train_loader"].dataset
    print("pseudo-label class counts from the untrained model:", torch.bincount(ds.pseudo, minlength=4).tolist())


for name, fn in dict(
        focal_binary_n1_vs_n=focal_binary, kd_softmax_time_dim=kd_time, multilabel_view_not_transpose=ml_view,
        ordinal_regression_n1_vs_n=ord_broadcast, sample_weight_n1_broadcast=weight_broadcast,
        class_weights_counter_order=counter_order, pos_weight_inverted=pos_weight,
        multilabel_with_crossentropy=ml_ce, coral_levels_off_by_one=coral,
        threshold_on_standardized_column=standardized, kd_teacher_in_optimizer=teacher_opt,
        head_replaced_after_optimizer=head_opt, freeze_by_substring_hits_student=substring,
        ordinal_cutpoints_plain_tensor=cutpoints, ssl_student_forward_in_no_grad=nograd,
        kd_kldiv_reduction_mean=kl_mean, kd_rampup_never_ramps=rampup, focal_pt_from_max=focal_max,
        exp_lr_per_batch=lr_batch, mean_teacher_ema_decay_too_high=ema,
        sampler_class_weights_not_per_sample=sampler_class, sampler_weights_counts_not_inverse=sampler_counts,
        fixmatch_views_of_different_rows=views, kd_cached_logits_misaligned=cached,
        pseudo_labels_from_untrained_model=pseudo).items():
    FIXES[name]["fact"] = fn

