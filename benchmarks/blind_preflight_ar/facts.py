"""The fact each broken case of set ar rests on, printed by ``verify.py`` before the case is trained next to its fix
(no preflight involved). Importing this module loads the cases and attaches each fact to ``FIXES``."""

from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_ar import cases_data as D
from benchmarks.blind_preflight_ar import cases_mechanics as M
from benchmarks.blind_preflight_ar import cases_shapes as S
from benchmarks.blind_preflight_ar import cases_targets as T
from benchmarks.blind_preflight_ar import cases_trained as W
from benchmarks.blind_preflight_ar.registry import FIXES, load_all

load_all()


def _first(kw):
    return next(iter(kw["train_loader"]))


def lstm_seq_first():
    lstm = nn.LSTM(3, 4)
    x = torch.randn(5, 7, 3)
    out, _ = lstm(x)
    x2 = x.clone()
    x2[4] += 1.0                                         # change the LAST sample only
    out2, _ = lstm(x2)
    changed = (out[:, -1] - out2[:, -1]).abs().sum(-1) > 1e-6
    print(f"  batch_first={lstm.batch_first}; out[:, -1] of samples 0..4 changed by editing sample 4: "
          f"{changed.tolist()} (recurrence runs over the batch axis)")


def view_vs_transpose():
    x = torch.arange(12).view(1, 4, 3)                   # (B, T=4, C=3)
    print(f"  (B, T, C) row-major {x[0].tolist()} -> view(B, C, T) channel 0 = {x.view(1, 3, 4)[0, 0].tolist()}, "
          f"transpose channel 0 = {x.transpose(1, 2)[0, 0].tolist()}")


def horizon_broadcast():
    kw = S.horizon_target_channel_dim()
    xb, yb = _first(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        diff = kw["model"](xb) - yb
    print(f"  prediction {tuple(kw['model'](xb).shape)} vs target {tuple(yb.shape)} -> loss over {tuple(diff.shape)}")


def first_step():
    gru = nn.GRU(1, 4, batch_first=True)
    x = torch.randn(2, 24, 1)
    x2 = x.clone()
    x2[:, 1:] = 0
    out, _ = gru(x)
    out2, _ = gru(x2)
    print(f"  out[:, 0] unchanged when steps 1..23 are zeroed: {torch.allclose(out[:, 0], out2[:, 0])}")


def pool_axis():
    z = torch.randn(2, 32, 64)                           # (B, filters, T)
    print(f"  feature map {tuple(z.shape)}: mean(dim=1) -> {tuple(z.mean(1).shape)} (per time step), "
          f"mean(dim=2) -> {tuple(z.mean(2).shape)} (per filter)")


def last_input_label():
    ds = T.NextValueWindows(torch.arange(40.0), 24, fixed=False)
    x, y = ds[0]
    print(f"  window ends with {x[-1].item():.0f}, target {y.item():.0f} (next value would be 24)")


def per_subject_encoding():
    subjects = T._subject_recordings(3, s=22)
    for x, names in subjects:
        classes = sorted(set(names))
        print(f"  subject activities {classes}: 'walk' -> {classes.index('walk') if 'walk' in classes else None}")


def unshifted_decoder():
    ds = T._seq2seq_batches(torch.arange(40.0).view(1, -1), 24, 8, fixed=False)
    x, dec_in, y = ds[0]
    print(f"  dec_in {dec_in[:4].tolist()}... target {y[:4].tolist()}... (identical: {torch.equal(dec_in, y)})")


def crossentropy_multihot():
    logits = torch.tensor([[4.0, 4.0, -4.0]])
    target = torch.tensor([[1.0, 1.0, 0.0]])
    print(f"  softmax of logits {logits.tolist()} = {F.softmax(logits, -1).tolist()}: CE can never put two tags "
          f"above 0.5; CE loss {F.cross_entropy(logits, target).item():.3f}")


def strided_labels():
    ds = T.StridedWindows(*T._recording(30000, s=26), 64, 32, fixed=False)
    ks = [0, 200, 400, 800]
    print(f"  window k starts at k*32; broken labels for k={ks}: {[int(ds[k][1]) for k in ks]}, centre labels: "
          f"{[int(ds.lab[k * 32 + 32]) for k in ks]}")


def other_hop():
    fine = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 2, 2]])
    print(f"  10 ms labels {fine[0].tolist()} -> [:, :6] {fine[0, :6].tolist()} vs [:, ::2] {fine[0, ::2].tolist()}")


def window_zscore():
    x, y = D._intensity_windows(400, s=32)
    z = (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)
    for c in range(4):
        print(f"  class {c}: raw std {x[y == c].std(1).mean():.2f}, per-window z-scored std "
              f"{z[y == c].std(1).mean():.2f}")


def shuffled_rows():
    s = torch.sin(torch.arange(200.0) / 3)
    sh = s[torch.randperm(200)]
    lag1 = lambda v: torch.corrcoef(torch.stack([v[:-1], v[1:]]))[0, 1].item()  # noqa: E731
    print(f"  lag-1 autocorrelation: ordered {lag1(s):.2f}, after row shuffle {lag1(sh):.2f}")


def raw_targets():
    kw = D.per_series_scaled_inputs_raw_targets()
    x, y, mu, sd = _first(kw)
    print(f"  inputs mean {x.mean():.2f} std {x.std():.2f}; targets mean {y.mean():.1f} std {y.std():.1f}; "
          f"store levels range {mu.min():.0f}..{mu.max():.0f}")


def mixup_perm():
    collate = D._mixup_collate(fixed=False)
    items = [(torch.full((2, 2), float(i)), torch.tensor(i % 5)) for i in range(5)]
    x, y = collate(items)
    print(f"  mixed inputs (mean value = lam*i + (1-lam)*j): {[round(v, 2) for v in x.mean((1, 2)).tolist()]}; "
          f"mixed labels' argmax: {y.argmax(-1).tolist()}")


def head_after_optimizer():
    kw = W.optimizer_before_head_swap()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  new head parameters in the optimizer: {[id(p) in in_opt for p in kw['model'].head.parameters()]}")


def encoder_only():
    kw = W.ae_optimizer_encoder_only()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  decoder parameters in the optimizer: {sum(id(p) in in_opt for p in kw['model'].decoder.parameters())}"
          f"/{len(list(kw['model'].decoder.parameters()))}")


def plain_tensor():
    kw = W.ar_coefficients_plain_tensor()
    print(f"  model.parameters(): {[n for n, _ in kw['model'].named_parameters()]}; coef is a "
          f"{type(kw['model'].coef).__name__} with requires_grad={kw['model'].coef.requires_grad}")


def no_grad_encoder():
    kw = W.encoder_under_no_grad()
    x, y = _first(kw)
    F.mse_loss(kw["model"](x), y).backward()
    print(f"  encoder grads after backward: {[p.grad is not None for p in kw['model'].encoder.parameters()]}")


def deepcopy_encoder():
    enc = nn.Linear(3, 3)
    wrapped = copy.deepcopy(enc)
    print(f"  deepcopy shares parameters with the original: "
          f"{any(a is b for a, b in zip(enc.parameters(), wrapped.parameters()))}")


def functional_dropout():
    x = torch.ones(1, 8)
    m = nn.Module()
    m.eval()
    print(f"  after eval(): F.dropout(x, 0.5) = {F.dropout(x, 0.5).tolist()}, "
          f"F.dropout(x, 0.5, training=m.training) = {F.dropout(x, 0.5, training=m.training).tolist()}")


def round_grad():
    w = torch.tensor([1.3], requires_grad=True)
    torch.round(w * 3).sum().backward()
    print(f"  d round(3w)/dw = {w.grad.item()}")


def uncapped_lambda():
    kw = M.warmup_lambda_never_caps()
    opt, sch = kw["optimizer"], kw["scheduler"]
    lrs = []
    for _ in range(300):
        opt.step()
        sch.step()
        lrs.append(opt.param_groups[0]["lr"])
    print(f"  lr after 5 / 100 / 300 steps: {lrs[4]:.4g} / {lrs[99]:.4g} / {lrs[299]:.4g} (base 0.002)")


def detach_each_step():
    cell = nn.GRUCell(2, 4)
    x = torch.randn(1, 5, 2, requires_grad=True)
    h = x.new_zeros(1, 4)
    for t in range(5):
        h = cell(x[:, t], h).detach() if t < 4 else cell(x[:, t], h)
    h.sum().backward()
    print(f"  |d h_T / d x_t| for t = 0..4: {[round(v, 3) for v in x.grad.abs().sum(-1)[0].tolist()]}")


def sigmoid_range():
    x = W._sensor_windows(300, s=55)
    x = (x - x.mean()) / x.std()
    print(f"  z-scored windows: {(x < 0).float().mean():.0%} of values negative; sigmoid range (0, 1)")


for name, fn in {
    "har_lstm_without_batch_first": lstm_seq_first,
    "accel_view_instead_of_permute": view_vs_transpose,
    "horizon_target_channel_dim": horizon_broadcast,
    "gru_forecaster_reads_first_step": first_step,
    "cnn_pools_over_filters": pool_axis,
    "next_value_label_is_last_input": last_input_label,
    "har_label_encoder_per_subject": per_subject_encoding,
    "seq2seq_teacher_forcing_unshifted": unshifted_decoder,
    "multilabel_tags_crossentropy": crossentropy_multihot,
    "har_window_label_not_strided": strided_labels,
    "sed_labels_at_other_hop": other_hop,
    "har_per_window_zscore": window_zscore,
    "series_shuffled_before_windowing": shuffled_rows,
    "per_series_scaled_inputs_raw_targets": raw_targets,
    "mixup_labels_other_permutation": mixup_perm,
    "optimizer_before_head_swap": head_after_optimizer,
    "ae_optimizer_encoder_only": encoder_only,
    "ar_coefficients_plain_tensor": plain_tensor,
    "encoder_under_no_grad": no_grad_encoder,
    "classifier_wraps_encoder_copy": deepcopy_encoder,
    "functional_dropout_in_eval": functional_dropout,
    "count_forecast_rounded_in_forward": round_grad,
    "warmup_lambda_never_caps": uncapped_lambda,
    "rnn_cell_loop_detaches_each_step": detach_each_step,
    "ae_sigmoid_output_on_zscored": sigmoid_range,
}.items():
    FIXES[name]["fact"] = fn
