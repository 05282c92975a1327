"""The fact each broken case of set bi rests on, printed without the preflight; importing this module attaches each
fact to its case's entry in ``FIXES`` (``verify.py`` prints it before training the case next to its fix)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_bi.registry import FIXES, load_all

CASES = load_all()


def _kw(name, fixed=False):
    return CASES[name].build() if not fixed else FIXES[name]["fixed"]()


def _batch(name):
    return next(iter(_kw(name)["train_loader"]))


def hetero_nll_target_column():
    x, y = _batch("hetero_nll_target_column")
    print(f"  fact: targets {tuple(y.shape)}, mean {(x.shape[0],)}: y - mu has shape {tuple((y - torch.zeros(len(x))).shape)}")


def quantile_target_tiled():
    y = torch.arange(3.0)
    print(f"  fact: y={y.tolist()} repeat(3)={y.repeat(3).tolist()} vs repeat_interleave(3)="
          f"{y.repeat_interleave(3).tolist()}")


def coral_levels_reshaped():
    y = torch.tensor([0, 4, 2])
    grid = (torch.arange(4)[:, None] < y[None, :]).float()
    print(f"  fact: y={y.tolist()} reshape -> {grid.reshape(-1, 4).tolist()} vs t() -> {grid.t().tolist()}")


def sensor_conv_view_not_transpose():
    x = torch.arange(12.0).view(1, 4, 3)   # (B, T, C): value = 3 t + c
    print(f"  fact: view(1, 3, 4) channel 0 = {x.view(1, 3, 4)[0, 0].tolist()} vs transpose channel 0 = "
          f"{x.transpose(1, 2)[0, 0].tolist()}")


def focal_index_matrix():
    p = torch.rand(4, 4).softmax(-1)
    y = torch.tensor([0, 1, 2, 3])
    print(f"  fact: probs[:, y] has shape {tuple(p[:, y].shape)}; gather gives {tuple(p.gather(1, y[:, None]).shape)}")


def coral_levels_ge():
    y = torch.tensor([0, 2, 4])
    ks = torch.arange(4)
    print(f"  fact: y={y.tolist()} '>=' levels sum {(y[:, None] >= ks).sum(1).tolist()} vs '>' "
          f"{(y[:, None] > ks).sum(1).tolist()}")


def pinball_sign_flipped():
    print("  fact: max(tau e, (tau-1) e) with e = q - y is the pinball loss of level 1 - tau at e = y - q")


def multitask_mask_after_fill():
    kw = _kw("multitask_mask_after_fill")
    m = kw["train_loader"].dataset.tensors[2]
    print(f"  fact: observed share in the training mask per task {m.mean(0).tolist()} (task 1 is 60% missing)")


def pos_weight_inverted():
    print(f"  fact: pos_weight {_kw('pos_weight_inverted')['loss_fn'].pos_weight.item():.3f} vs fixed "
          f"{_kw('pos_weight_inverted', True)['loss_fn'].pos_weight.item():.1f}")


def multitask_task_columns_swapped():
    kw = _kw("multitask_task_columns_swapped")
    print(f"  fact: train target row 0 {kw['train_loader'].dataset[0][1].tolist()} vs stored "
          f"{kw['train_loader'].dataset.y[0].tolist()}")


def scale_net_not_in_optimizer():
    kw = _kw("scale_net_not_in_optimizer")
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  fact: scale_net parameters in the optimizer: "
          f"{sum(id(p) in held for p in kw['model'].scale_net.parameters())}")


def mean_head_on_detached_trunk():
    kw = _kw("mean_head_on_detached_trunk")
    x, y = next(iter(kw["train_loader"]))
    out = kw["model"](x)
    out[:, 0].sum().backward()
    print(f"  fact: trunk grad norm from the mean output alone: "
          f"{sum((p.grad.norm() if p.grad is not None else 0) for p in kw['model'].trunk.parameters()):.3g}")


def coral_thresholds_buffer():
    m = _kw("coral_thresholds_buffer")["model"]
    print(f"  fact: 'bias' in named_parameters: {'bias' in dict(m.named_parameters())}; buffers: "
          f"{[n for n, _ in m.named_buffers()]}")


def quantile_trunk_no_grad():
    kw = _kw("quantile_trunk_no_grad")
    x, y = next(iter(kw["train_loader"]))
    kw["model"](x).sum().backward()
    print(f"  fact: trunk grads are None: {all(p.grad is None for p in kw['model'].trunk.parameters())}")


def quantile_net_rebuilt_after_optimizer():
    kw = _kw("quantile_net_rebuilt_after_optimizer")
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  fact: model parameters held by the optimizer: "
          f"{sum(id(p) in held for p in kw['model'].parameters())}/{len(list(kw['model'].parameters()))}")


def coral_levels_with_cross_entropy():
    levels = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    print(f"  fact: softmax cross entropy of multi-hot levels is minimised by equal shares "
          f"{F.softmax(torch.tensor([[5.0, 5.0, 5.0, -5.0]]), -1).tolist()}, not by per-level sigmoids of 1; "
          f"target row sums {levels.sum(1).tolist()}")


def gaussian_nll_given_std():
    print("  fact: gaussian_nll_loss(mu, y, var) with var = scale is minimised at scale = sigma ** 2, "
          "e.g. sigma 0.1 -> scale 0.01")


def weighted_sampler_no_replacement():
    kw = _kw("weighted_sampler_no_replacement")
    idx = list(kw["train_loader"].sampler)
    print(f"  fact: {len(idx)} draws, {len(set(idx))} distinct indices (a permutation)")


def gru_reads_padded_last_step():
    kw = _kw("gru_reads_padded_last_step")
    lengths = kw["train_loader"].dataset.tensors[1]
    print(f"  fact: mean padding steps after the last real reading: {(40 - lengths).float().mean():.1f}")


def bce_weight_instead_of_pos_weight():
    lf = _kw("bce_weight_instead_of_pos_weight")["loss_fn"]
    print(f"  fact: weight={lf.weight.tolist()} pos_weight={lf.pos_weight}")


def sampler_given_class_weights():
    idx = list(_kw("sampler_given_class_weights")["train_loader"].sampler)
    print(f"  fact: distinct indices drawn: {sorted(set(idx))}")


def window_target_at_start():
    ds = _kw("window_target_at_start")["train_loader"].dataset
    print(f"  fact: window 0 covers rows 0..{ds.w - 1}; its target is y[0], fixed y[{ds.w}]")


def collate_sorts_inputs_not_targets():
    from benchmarks.blind_preflight_bi.cases_data import sorting_collate
    ds = _kw("collate_sorts_inputs_not_targets")["train_loader"].dataset
    items = [ds[i] for i in range(4)]
    _, lengths, ys = sorting_collate(False)(items)
    print(f"  fact: lengths {[len(i[0]) for i in items]} sorted to {lengths.tolist()}; targets stay "
          f"{[round(v, 2) for v in ys.tolist()]}")


def ordinal_labels_alphabetical():
    from benchmarks.blind_preflight_bi.cases_data import GRADES
    print(f"  fact: sorted(set(grades)) = {sorted(set(GRADES))} vs natural {GRADES}")


def train_columns_sorted_by_name():
    from benchmarks.blind_preflight_bi.cases_data import sensor_table
    cols, _ = sensor_table(10)
    print(f"  fact: train order {sorted(cols)} vs val order {list(cols)}")


for _name in list(FIXES):
    FIXES[_name]["fact"] = globals()[_name]
