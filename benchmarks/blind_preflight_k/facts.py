"""The fact each broken case rests on, printed by ``verify.py`` before the case is trained next to its fix (no
preflight involved). Importing this module attaches each function to its case's entry in ``FIXES``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_k.registry import CASES, FIXES, load_all

load_all()


def _kw(name, fixed=False):
    builder = CASES[name].build
    return FIXES[name]["fixed"]() if fixed else builder()


def _first(kw):
    return next(iter(kw["train_loader"]))


def price():
    kw = _kw("price_mlp_target_broadcast")
    x, y = _first(kw)
    out = kw["model"](x)
    print(f"  output {tuple(out.shape)}, target {tuple(y.shape)}, broadcast {tuple(torch.broadcast_shapes(out.shape, y.shape))}")


def sensor():
    kw = _kw("sensor_lstm_missing_batch_first")
    x, _ = _first(kw)
    lstm = kw["model"].lstm
    print(f"  lstm.batch_first={lstm.batch_first}, input {tuple(x.shape)} read as (time={x.shape[0]}, batch={x.shape[1]})")


def tiles():
    img = torch.arange(2 * 2 * 3).reshape(1, 2, 2, 3)
    print(f"  reshape channel 0: {img.reshape(1, 3, 2, 2)[0, 0].flatten().tolist()}, "
          f"permute channel 0: {img.permute(0, 3, 1, 2)[0, 0].flatten().tolist()}")


def logsoftmax():
    kw = _kw("loan_mlp_logsoftmax_dim0")
    x, _ = _first(kw)
    p = kw["model"](x).exp()
    print(f"  row sums {p.sum(1)[:3].tolist()}, column sums {p.sum(0)[:3].tolist()}")


def tagger():
    kw = _kw("pos_tagger_seqfirst_flatten")
    x, y = _first(kw)
    print(f"  logits {tuple(kw['model'](x).shape)} vs tags {tuple(y.shape)}")


def mask255():
    kw = _kw("lesion_unet_mask_255")
    _, y = _first(kw)
    print(f"  mask values {sorted(y.unique().tolist())}; BCE(logit=5, target=255) = "
          f"{F.binary_cross_entropy_with_logits(torch.tensor(5.0), torch.tensor(255.0)).item():.1f}")


def gpt2():
    kw = _kw("gpt2_labels_preshifted")
    b = next(iter(kw["train_loader"]))
    print(f"  input_ids {b['input_ids'][0, :5].tolist()}, labels {b['labels'][0, :5].tolist()} (shifted again inside)")


def wine():
    kw = _kw("wine_rating_long_targets")
    ds = kw["train_loader"].dataset
    print(f"  target dtype {ds.y.dtype}, first targets {ds.y[:5].tolist()}")


def minus_one():
    kw = _kw("photo_tags_unknown_minus_one")
    _, y = _first(kw)
    print(f"  share of -1 targets {(y == -1).float().mean():.2f}; BCE(logit=-10, target=-1) = "
          f"{F.binary_cross_entropy_with_logits(torch.tensor(-10.0), torch.tensor(-1.0)).item():.1f}")


def weights():
    kw = _kw("churn_class_weights_inverted")
    print(f"  CrossEntropyLoss weight {kw['loss_fn'].weight.tolist()}")


def python_list():
    kw = _kw("insurance_layers_in_python_list")
    print(f"  named parameters {[n for n, _ in kw['model'].named_parameters()]}")


def head_swap():
    kw = _kw("defect_head_swapped_after_optimizer")
    in_model = {id(p) for p in kw["model"].parameters()}
    opt = [p for g in kw["optimizer"].param_groups for p in g["params"]]
    print(f"  optimizer tensors in the model: {sum(id(p) in in_model for p in opt)}/{len(opt)}")


def zero_init():
    kw = _kw("churn_zero_init")
    x, y = _first(kw)
    F.cross_entropy(kw["model"](x), y).backward()
    print(f"  grad norms {[round(p.grad.norm().item(), 4) for p in kw['model'].parameters()]}")


def dropout():
    kw = _kw("credit_dropout_keep_prob")
    print(f"  dropout p {[m.p for m in kw['model'] if isinstance(m, nn.Dropout)]}")


def no_grad():
    kw = _kw("review_encoder_under_no_grad")
    x, y = _first(kw)
    F.cross_entropy(kw["model"](x), y).backward()
    print(f"  emb.weight.grad is None: {kw['model'].emb.weight.grad is None}")


def steplr():
    kw = _kw("fraud_steplr_per_batch")
    for _ in range(300):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print(f"  LR after 300 steps: {kw['optimizer'].param_groups[0]['lr']:.2e}")


def rewrapped():
    kw = _kw("demand_loss_rewrapped")
    loss = kw["loss_fn"](kw["model"], _first(kw))
    print(f"  loss.grad_fn = {loss.grad_fn}, is_leaf = {loss.is_leaf}")


def softmax_ce():
    kw = _kw("species_softmax_then_ce")
    out = kw["model"](_first(kw)[0])
    print(f"  model output range [{out.min():.3f}, {out.max():.3f}], row sum {out.sum(1)[0]:.3f}")


def lambdalr():
    kw = _kw("ticket_lambdalr_absolute")
    print(f"  effective LR at step 0: {kw['optimizer'].param_groups[0]['lr']:.1e}")


def sum_reduction():
    kw = _kw("energy_sum_reduction_sgd")
    x, y = _first(kw)
    out = kw["model"](x)
    print(f"  sum / mean loss ratio {(F.mse_loss(out, y, reduction='sum') / F.mse_loss(out, y)).item():.0f}")


def shuffled():
    kw = _kw("heart_shuffled_separately")
    xt, yt = kw["train_loader"].dataset.tensors
    x, y = _kw("heart_shuffled_separately", fixed=True)["train_loader"].dataset.tensors
    lookup = {tuple(r.tolist()): int(l) for r, l in zip(x, y)}
    agree = sum(lookup[tuple(r.tolist())] == int(l) for r, l in zip(xt, yt)) / len(yt)
    print(f"  share of rows keeping their own label: {agree:.2f}")


def collate():
    kw = _kw("session_collate_unsorted_labels")
    padded, lengths, y = _first(kw)
    print(f"  lengths {lengths[:5].tolist()} (sorted), labels in loader order {y[:5].tolist()}")


def per_row():
    kw = _kw("meter_standardised_per_row")
    x, _ = kw["train_loader"].dataset.tensors
    print(f"  row means {x.mean(1)[:3].tolist()}, column std {x.std(0)[:3].tolist()}")


def sampler():
    kw = _kw("fault_sampler_class_weights")
    idx = sorted(set(iter(kw["train_loader"].sampler)))
    print(f"  distinct indices drawn: {idx}")


def dataset_len():
    kw = _kw("crop_dataset_len_columns")
    print(f"  len(dataset) = {len(kw['train_loader'].dataset)} of {kw['train_loader'].dataset.X.shape[0]} rows")


for _name, _fn in {"price_mlp_target_broadcast": price, "sensor_lstm_missing_batch_first": sensor,
                   "satellite_cnn_nhwc_reshape": tiles, "loan_mlp_logsoftmax_dim0": logsoftmax,
                   "pos_tagger_seqfirst_flatten": tagger, "lesion_unet_mask_255": mask255,
                   "gpt2_labels_preshifted": gpt2, "wine_rating_long_targets": wine,
                   "photo_tags_unknown_minus_one": minus_one, "churn_class_weights_inverted": weights,
                   "insurance_layers_in_python_list": python_list,
                   "defect_head_swapped_after_optimizer": head_swap, "churn_zero_init": zero_init,
                   "credit_dropout_keep_prob": dropout, "review_encoder_under_no_grad": no_grad,
                   "fraud_steplr_per_batch": steplr, "demand_loss_rewrapped": rewrapped,
                   "species_softmax_then_ce": softmax_ce, "ticket_lambdalr_absolute": lambdalr,
                   "energy_sum_reduction_sgd": sum_reduction, "heart_shuffled_separately": shuffled,
                   "session_collate_unsorted_labels": collate, "meter_standardised_per_row": per_row,
                   "fault_sampler_class_weights": sampler, "crop_dataset_len_columns": dataset_len}.items():
    FIXES[_name]["fact"] = _fn
