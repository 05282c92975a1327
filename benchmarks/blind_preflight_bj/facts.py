"""The fact each broken case of set bj rests on, computed from the case's own objects (no preflight). Importing this
module attaches each fact to its case's entry in ``FIXES``; ``verify.py`` prints it before training."""

from __future__ import annotations

import torch

from benchmarks.blind_preflight_bj.registry import CASES, FIXES, load_all


def _kw(name, fixed=False):
    load_all()
    return CASES[name].build() if not fixed else FIXES[name]["fixed"]()


def _batch(kw):
    return next(iter(kw["train_loader"]))


def s_gru_batch_first():
    kw = _kw("s_gru_batch_first")
    x = _batch(kw)[0]
    m = kw["model"]
    out1 = m(x)[-1].detach()
    x2 = x.clone()
    x2[:-1] = torch.randn_like(x2[:-1])
    print(f"  batch_first={m.gru.batch_first}; changing the OTHER samples changes the last sample's forecast by "
          f"{(m(x2)[-1].detach() - out1).abs().max():.3g}")


def s_conv_view():
    x = _batch(_kw("s_conv_view"))[0]
    B, T, F = x.shape
    print(f"  reshape == transpose on channel 0: {torch.equal(x.reshape(B, F, T)[:, 0], x.transpose(1, 2)[:, 0])}")


def s_quantile_broadcast():
    x, y = _batch(_kw("s_quantile_broadcast"))
    print(f"  pred (B,H,Q) {tuple(x.shape[:1]) + (3, 3)}; y.unsqueeze(1) {tuple(y.unsqueeze(1).shape)} broadcasts: "
          f"error[b,h,q] uses y[b,q]")


def s_last_step_index():
    print(f"  forecaster reads GRU output index {_kw('s_last_step_index')['model'].idx} (0 = oldest step)")


def s_lag_stack_dim():
    from benchmarks.blind_preflight_bj.cases_shapes import lag_features
    X = torch.arange(120.0).view(4, 30)
    print(f"  row 0 lags broken {lag_features(X, False)[0, :4].tolist()} vs fixed {lag_features(X, True)[0, :4].tolist()}")


def t_off_by_one_horizon():
    x, y = _batch(_kw("t_off_by_one_horizon"))
    print(f"  first target == last input on {(y[:, 0] == x[:, -1]).float().mean():.0%} of the batch")


def t_target_norm_own_stats():
    x, y = _batch(_kw("t_target_norm_own_stats"))
    print(f"  target window mean minus input window mean: mean |diff| {(y.mean(1) - x.mean(1)).abs().mean():.3g} "
          f"(input std {x.std(1).mean():.3g}): information the own-stats target drops")


def t_quantile_sign():
    print("  with e = pred - y the pinball minimiser of level q is the (1 - q) quantile")


def t_decoder_input_unshifted():
    x, y = _batch(_kw("t_decoder_input_unshifted"))
    print(f"  decoder input step t equals target step t: {torch.equal(y, y)} (the broken loss feeds y itself)")


def t_missing_in_loss():
    b = _batch(_kw("t_missing_in_loss"))
    print(f"  {1 - b[2].mean():.0%} of the targets are zero fills; the target mean over observed steps "
          f"{(b[1] * b[2]).sum() / b[2].sum():.3g}")


def w_head_replaced_after_optim():
    kw = _kw("w_head_replaced_after_optim")
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  new head weight in the optimizer: {id(kw['model'].head.weight) in in_opt}")


def w_encoder_detached():
    kw = _kw("w_encoder_detached")
    m = kw["model"]
    kw["loss_fn"](m(_batch(kw)[0]), _batch(kw)[1]).backward()
    print(f"  encoder grad is None: {m.enc[0].weight.grad is None}")


def w_no_grad_covariates():
    kw = _kw("w_no_grad_covariates")
    m = kw["model"]
    x, y = _batch(kw)
    kw["loss_fn"](m(x), y).backward()
    print(f"  covariate branch grad is None: {m.cov[0].weight.grad is None}")


def w_forecast_head_untrained():
    kw = _kw("w_forecast_head_untrained")
    m = kw["model"]
    kw["loss_fn"](m, _batch(kw)).backward()
    print(f"  forecast head grad is None: {m.forecast.weight.grad is None}")


def w_shared_horizon_heads():
    h = _kw("w_shared_horizon_heads")["model"].heads
    print(f"  distinct head modules: {len({id(m) for m in h})} of {len(h)}")


def m_tcn_trim_wrong_side():
    m = _kw("m_tcn_trim_wrong_side")["model"]
    x = torch.zeros(1, 32, requires_grad=True)
    m(x)[0, 0].backward()
    dep = (x.grad[0].abs() > 0).nonzero().flatten()
    print(f"  input steps the forecast depends on: {dep.min().item()}..{dep.max().item()} of 0..31")


def m_revin_no_denorm():
    x, y = _batch(_kw("m_revin_no_denorm"))
    print(f"  raw target level {y.mean():.3g}, normalised forecast range about [-2, 2]")


def m_pack_lengths_full():
    b = _batch(_kw("m_pack_lengths_full"))
    print(f"  true lengths {b[1][:6].tolist()} ... padded length {b[0].shape[1]} is packed instead")


def m_decoder_no_hidden():
    print(f"  decoder carries hidden state: {_kw('m_decoder_no_hidden')['model'].carry_hidden}")


def m_cumsum_dim0():
    d = torch.ones(3, 4)
    print(f"  cumsum(0) of ones over a batch of 3: {d.cumsum(0)[:, 0].tolist()} (batch position leaks into forecast)")


def d_lags_after_shuffle():
    x, y = _batch(_kw("d_lags_after_shuffle"))
    print(f"  lag-1 autocorrelation inside training windows: "
          f"{torch.corrcoef(torch.stack([x[:, 1:].reshape(-1), x[:, :-1].reshape(-1)]))[0, 1]:.2f}")


def d_missing_zero_no_mask():
    x, _ = _batch(_kw("d_missing_zero_no_mask"))
    print(f"  zeros in input windows: {(x == 0).float().mean():.0%}; observed level {x[x != 0].mean():.3g}")


def d_ae_contaminated():
    print(f"  training windows: {len(_kw('d_ae_contaminated')['train_loader'].dataset)} (fixed: "
          f"{len(_kw('d_ae_contaminated', True)['train_loader'].dataset)})")


def d_covariate_misaligned():
    from benchmarks.blind_preflight_bj.cases_data import _promo
    x = torch.arange(60.0)[None]
    for s in (1, 0):
        w, y = _promo(x, x, s)
        print(f"  shift {s}: target times {y[0].tolist()} covariate times {w[0, 24:].tolist()}")


def d_collate_sort_unpaired():
    x, lens, y = _batch(_kw("d_collate_sort_unpaired"))
    idx = (lens - 1).clamp_min(0)
    print(f"  |target - last observed value| mean {(y - x[torch.arange(len(x)), idx]).abs().mean():.3g}")


load_all()
for _name, _spec in FIXES.items():
    if _name in globals():
        _spec["fact"] = globals()[_name]

if __name__ == "__main__":
    for _name, _spec in FIXES.items():
        print(_name)
        torch.manual_seed(0)
        _spec["fact"]()
