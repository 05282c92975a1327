"""The fact each broken case of set az rests on, printed by ``verify.py`` before the case is trained next to its fix
(no preflight involved). Importing this module attaches each function to its entry in ``FIXES``."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_az import (
    cases_data,
    cases_mechanics,
    cases_shapes,
    cases_targets,
    cases_trained,
)
from benchmarks.blind_preflight_az.registry import FIXES, windows

FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        return fn
    return register


def _first(kw):
    return next(iter(kw["train_loader"]))


@fact("shapes_next_step_target_1d")
def _f1():
    kw = cases_shapes.shapes_next_step_target_1d()
    x, y = _first(kw)
    out = kw["model"](x)
    print(f"  output {tuple(out.shape)} vs target {tuple(y.shape)} -> (out - y) is {tuple((out - y).shape)}")


@fact("shapes_har_view_not_permute")
def _f2():
    x = torch.arange(4 * 3).reshape(1, 4, 3).float()         # (B, T=4, C=3)
    print(f"  view(B, 3, T) channel 0: {x.view(1, 3, -1)[0, 0].tolist()}; transpose channel 0: "
          f"{x.transpose(1, 2)[0, 0].tolist()}")


@fact("shapes_lstm_not_batch_first")
def _f3():
    kw = cases_shapes.shapes_lstm_not_batch_first()
    lstm = kw["model"].lstm
    print(f"  batch_first={lstm.batch_first}: a (64, 20, 1) batch is read as 64 time steps of 20 sequences")


@fact("shapes_horizon_reshape_not_transpose")
def _f4():
    by_h = torch.arange(3)[:, None] * 100 + torch.arange(4)             # (H=3, N=4): 100*h + window
    print(f"  window 1 targets: reshape -> {by_h.reshape(4, 3)[1].tolist()}, .T -> {by_h.T[1].tolist()}")


@fact("shapes_per_step_ce_reshape")
def _f5():
    logits = torch.arange(2 * 3).reshape(1, 2, 3)                      # (B, T=2, K=3)
    print(f"  reshape(B, K, T)[0, :, 0] = {logits.reshape(1, 3, 2)[0, :, 0].tolist()} vs permute "
          f"{logits.permute(0, 2, 1)[0, :, 0].tolist()} (scores of time step 0)")


@fact("targets_window_includes_target")
def _f6():
    s = torch.arange(10.0)
    x, y = windows(s, 4, 1, offset=-1)
    print(f"  window {x[0].tolist()} -> target {y[0].tolist()} (the last input sample)")


@fact("targets_revin_no_denorm")
def _f7():
    kw = cases_targets.targets_revin_no_denorm()
    x, y = _first(kw)
    print(f"  target mean {y.mean():.1f} std {y.std():.1f}; model output before training mean "
          f"{kw['model'](x).mean():.2f}: the normalised output is never mapped back")


@fact("targets_har_label_first_sample")
def _f8():
    a, b = cases_targets._har_label_windows(31, 20000, first=True), cases_targets._har_label_windows(31, 20000)
    print(f"  first-sample label != majority label on {(a[1] != b[1]).float().mean():.0%} of the windows")


@fact("targets_pinball_sign_flipped")
def _f9():
    y = torch.randn(10000) * 2
    q = torch.linspace(-4, 4, 161)
    loss = [torch.maximum(0.9 * (p - y), -0.1 * (p - y)).mean() for p in q]
    print(f"  argmin of the flipped loss {q[int(torch.stack(loss).argmin())]:.2f}; true P90 {y.quantile(0.9):.2f}, "
          f"P10 {y.quantile(0.1):.2f}")


@fact("targets_teacher_forcing_unshifted")
def _f10():
    y = torch.arange(1.0, 6.0)
    print(f"  targets {y.tolist()}; decoder inputs (bug) {y.tolist()}; shifted {[0.0] + y[:-1].tolist()}")


@fact("trained_series_bias_from_pretrained_frozen")
def _f11():
    e = nn.Embedding.from_pretrained(torch.zeros(3, 1))
    print(f"  nn.Embedding.from_pretrained(...).weight.requires_grad = {e.weight.requires_grad}")


@fact("trained_ae_optimizer_encoder_only")
def _f12():
    kw = cases_trained.trained_ae_optimizer_encoder_only()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    dec = list(kw["model"].decoder.parameters())
    print(f"  decoder parameters in the optimizer: {sum(id(p) in in_opt for p in dec)}/{len(dec)}")


@fact("trained_hour_effect_plain_tensor")
def _f13():
    kw = cases_trained.trained_hour_effect_plain_tensor()
    names = [n for n, _ in kw["model"].named_parameters()]
    print(f"  named_parameters: {names} (no hour_effect)")


@fact("trained_model_rebuilt_after_optimizer")
def _f14():
    kw = cases_trained.trained_model_rebuilt_after_optimizer()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  model parameters held by the optimizer: {sum(id(p) in in_opt for p in kw['model'].parameters())}")


@fact("trained_series_scale_not_in_optimizer")
def _f15():
    kw = cases_trained.trained_series_scale_not_in_optimizer()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  series_scale in the optimizer: {id(kw['model'].series_scale) in in_opt}")


@fact("mechanics_steplr_epochs_stepped_per_batch")
def _f16():
    kw = cases_mechanics.mechanics_steplr_epochs_stepped_per_batch()
    for _ in range(300):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print(f"  LR after 300 steps: {kw['optimizer'].param_groups[0]['lr']:.3g} (start 1e-3)")


@fact("mechanics_class_weights_counts")
def _f17():
    kw = cases_mechanics.mechanics_class_weights_counts()
    print(f"  class weights {[round(w, 3) for w in kw['loss_fn'].weight.tolist()]} (largest for the commonest)")


@fact("mechanics_detach_inside_time_loop")
def _f18():
    cell = nn.GRUCell(1, 4)
    x = torch.randn(2, 5, 1, requires_grad=True)
    h = torch.zeros(2, 4)
    for t in range(5):
        h = cell(x[:, t], h).detach() if t < 4 else cell(x[:, t], h)
    h.sum().backward()
    print(f"  |grad| wrt each input step: {x.grad.abs().sum((0, 2)).tolist()}")


@fact("mechanics_loss_square_of_mean")
def _f19():
    err = torch.tensor([3.0, -3.0])
    print(f"  errors {err.tolist()}: mean()**2 = {err.mean() ** 2:.1f}, (err**2).mean() = {(err ** 2).mean():.1f}")


@fact("mechanics_relu_output_zscored_target")
def _f20():
    kw = cases_mechanics.mechanics_relu_output_zscored_target()
    y = torch.cat([b[1] for b in kw["train_loader"]])
    print(f"  {(y < 0).float().mean():.0%} of the z-scored targets are negative; the output ends in "
          f"{type(kw['model'][-1]).__name__}")


@fact("data_covariate_joined_by_position")
def _f21():
    t, load = cases_data._load_and_temp(161, 3000)
    print(f"  corr(load, temp) aligned {torch.corrcoef(torch.stack([load, t]))[0, 1]:.2f}, "
          f"by position after a descending sort {torch.corrcoef(torch.stack([load, t.flip(0)]))[0, 1]:.2f}")


@fact("data_windows_cross_series_boundary")
def _f22():
    p = cases_data._stacked_panel(171)
    n = p.numel() - 24
    print(f"  series of length {p.shape[1]}: {sum((i // p.shape[1]) != ((i + 24) // p.shape[1]) for i in range(n))}"
          f"/{n} windows take inputs or target from two series")


@fact("data_gaps_filled_with_zero")
def _f23():
    raw = cases_data._temperature_with_gaps(181, 4000, 0.15)
    print(f"  {torch.isnan(raw).float().mean():.0%} of readings missing; mean with zeros "
          f"{torch.nan_to_num(raw).mean():.1f} vs observed {raw[~torch.isnan(raw)].mean():.1f}")


@fact("data_dropna_features_only")
def _f24():
    _, _, missing = cases_data._machine_log(191, 4000)
    print(f"  {int(missing[:-1].sum())} rows dropped from X only: the last target is {int(missing[:-1].sum())} "
          "steps off")


@fact("data_har_sorted_no_shuffle")
def _f25():
    kw = cases_data.data_har_sorted_no_shuffle()
    labels = [b[1] for _, b in zip(range(300), kw["train_loader"])]
    seen = torch.cat(labels).unique().tolist()
    print(f"  batches with one activity: {sum(len(lb.unique()) == 1 for lb in labels)}/300; activities seen in "
          f"300 steps: {seen}; last batch {labels[-1].unique().tolist()}")


for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
