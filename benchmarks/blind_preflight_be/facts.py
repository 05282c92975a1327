"""The fact each broken case rests on, printed by ``verify.py`` before the case is trained next to its fix (no
preflight involved). Importing this module attaches each function to its case's entry in ``FIXES``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_be.registry import CASES, FIXES, load_all

load_all()


def _kw(name, fixed=False):
    return FIXES[name]["fixed"]() if fixed else CASES[name].build()


def _first(kw):
    return next(iter(kw["train_loader"]))


def _grad_norms(kw, names):
    model = kw["model"]
    model.zero_grad()
    kw["loss_fn"](model, _first(kw)).backward() if not isinstance(kw["loss_fn"], torch.nn.Module) else \
        kw["loss_fn"](model(_first(kw)[0]), _first(kw)[1]).backward()
    out = {}
    for n, p in model.named_parameters():
        if any(n.startswith(k) for k in names):
            out[n] = 0.0 if p.grad is None else round(p.grad.norm().item(), 5)
    model.zero_grad()
    return out


def softmax_dim0():
    z = torch.randn(16, 5)
    print(f"  softmax(dim=0) rows sum to {F.softmax(z, 0).sum(1)[:3].tolist()} (columns sum to 1 instead)")


def extra_axis():
    print(f"  broadcast of (64, 1, 5) with (64, 5): {tuple(torch.broadcast_shapes((64, 1, 5), (64, 5)))}")


def prune_axis():
    w = torch.randn(64, 16)
    print(f"  norm(dim=0) shape {tuple(w.norm(dim=0, keepdim=True).shape)} (per input), "
          f"norm(dim=1) shape {tuple(w.norm(dim=1, keepdim=True).shape)} (per neuron)")


def svd_t():
    w = torch.randn(4, 4)
    x = torch.randn(1, 4)
    print(f"  x @ W equals F.linear(x, W): {torch.allclose(x @ w, F.linear(x, w, None))}; "
          f"x @ W.T does: {torch.allclose(x @ w.T, F.linear(x, w, None))}")


def time_major():
    print(f"  (T, B) flattened row order: {[(i // 2, i % 2) for i in range(6)]} as (t, b); student rows are (b, t)")


def class_order():
    print("  teacher column -> dataset class mapping: [2, 0, 4, 1, 3] (not the identity)")


def no_offset():
    kw = _kw("class_incremental_no_offset")
    print(f"  labels in the task-2 training set: {torch.unique(kw['train_loader'].dataset.tensors[1]).tolist()} of 0..7")


def ml_softmax():
    z = torch.randn(4, 6) + 1
    print(f"  softmax targets max {F.softmax(z, -1).max().item():.2f}, row sums {F.softmax(z, -1).sum(1)[0].item():.2f}")


def zscored():
    print("  teacher outputs are in std units around 0; targets are raw values around 40")


def single_logit():
    print(f"  softmax over a (4, 1) logit: {F.softmax(torch.randn(4, 1), -1).flatten().tolist()}")


def round_grad():
    w = torch.randn(5, requires_grad=True)
    torch.round(w * 3).sum().backward()
    print(f"  grad of round(w * 3): {w.grad.tolist()}")


def lowrank_opt():
    kw = _kw("lowrank_after_optimizer")
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    live = list(kw["model"].parameters())
    print(f"  model parameters held by the optimizer: {sum(id(p) in held for p in live)}/{len(live)}")


def shared_data():
    kw = _kw("weight_sharing_through_data")
    print(f"  grad norms: {_grad_norms(kw, ['shared'])}")


def teacher_opt():
    kw = _kw("kd_teacher_in_optimizer")
    n = sum(p.numel() for g in kw["optimizer"].param_groups for p in g["params"])
    print(f"  optimizer holds {n} weights; student has {sum(p.numel() for p in kw['model'].student.parameters())}")


def zero_factors():
    kw = _kw("lowrank_factors_zero_init")
    print(f"  grad norms: {_grad_norms(kw, ['2.'])}")


def inplace_round():
    print("  3-bit step = max|w|/3 ~ 0.1; an Adam step of 1e-3 is rounded back onto the grid")


def inverted_mask():
    w = torch.tensor([0.1, -2.0, 0.5, 3.0])
    print(f"  abs(w) < thr keeps {(w.abs() < 1.0).tolist()} for w={w.tolist()}")


def ewc_ref():
    p = torch.nn.Parameter(torch.ones(2))
    anchor = p
    with torch.no_grad():
        p.add_(1.0)
    print(f"  after an update, p - anchor = {(p - anchor).tolist()}")


def lwf_alias():
    print("  old model is the trained model: the LwF KL is 0 with zero gradient at every step")


def mask_before_load():
    print("  masks computed from random init weights, then the pretrained checkpoint is loaded under them")


def cached_shuffled():
    print("  cache order = the shuffled loader's order, dataset order = index order")


def collate_order():
    print("  inputs: [replay, new]; labels: [new, replay]")


def raw_teacher():
    kw = _kw("kd_standardised_inputs_raw_teacher")
    x, _ = _first(kw)
    print(f"  student batch mean {x.mean().item():.2f}, std {x.std().item():.2f}; the teacher expects raw sensor units")


def uniform():
    print(f"  torch.rand min {torch.rand(1000).min().item():.3f}; real features are N(0, 1)")


def sorted_head():
    kw = _kw("replay_buffer_sorted_head")
    y = kw["train_loader"].dataset.tensors[1]
    print(f"  old classes in the training set: {torch.unique(y[y < 4]).tolist()}")


for _name, _fn in {"kd_softmax_over_batch": softmax_dim0, "kd_student_extra_axis_broadcast": extra_axis,
                   "structured_prune_wrong_axis": prune_axis, "svd_compressed_transposed": svd_t,
                   "seq_kd_teacher_time_major": time_major, "kd_teacher_class_order": class_order,
                   "class_incremental_no_offset": no_offset, "multilabel_teacher_softmax": ml_softmax,
                   "kd_regression_teacher_zscored": zscored, "kd_binary_softmax_single_logit": single_logit,
                   "qat_round_without_ste": round_grad, "lowrank_after_optimizer": lowrank_opt,
                   "weight_sharing_through_data": shared_data, "kd_teacher_in_optimizer": teacher_opt,
                   "lowrank_factors_zero_init": zero_factors, "qat_inplace_weight_rounding": inplace_round,
                   "magnitude_mask_inverted": inverted_mask, "ewc_anchor_by_reference": ewc_ref,
                   "lwf_old_model_not_copied": lwf_alias, "prune_mask_before_load": mask_before_load,
                   "kd_cached_logits_shuffled": cached_shuffled, "replay_collate_label_order": collate_order,
                   "kd_standardised_inputs_raw_teacher": raw_teacher, "kd_transfer_set_uniform": uniform,
                   "replay_buffer_sorted_head": sorted_head}.items():
    FIXES[_name]["fact"] = _fn
