"""The fact each broken case of set r rests on, printed by verify.py before the case is trained next to its fix
(no preflight). Each entry is attached to the case's FIXES row."""

from __future__ import annotations

import torch

from benchmarks.blind_preflight_r.registry import FIXES, load_all

CASES = load_all()


def built(name, fixed=False):
    c = CASES[name]
    return FIXES[name]["fixed"]() if fixed else c.build()


def first_batch(kw):
    return next(iter(kw["train_loader"]))


def fact_har():
    m = built("har_lstm_seq_first")["model"]
    print(f"  lstm.batch_first={m.lstm.batch_first}; batch x shape {tuple(first_batch(built('har_lstm_seq_first'))[0].shape)}")


def fact_kws():
    x = torch.arange(16 * 24.).view(1, 16, 24)
    print(f"  frame 1 by view: {x.view(1, 24, 16)[0, 1, :4].tolist()} vs by transpose: {x.transpose(1, 2)[0, 1, :4].tolist()}")


def fact_conv():
    m = built("sentiment_conv1d_channels_are_tokens")["model"]
    print(f"  conv in_channels={m.conv.in_channels} (sequence length 30), embedding dim {m.emb.embedding_dim}")


def fact_seg():
    x = torch.arange(2 * 4 * 2 * 2.).view(2, 4, 2, 2)
    print(f"  row 0 of view(-1, 4): {x.view(-1, 4)[0].tolist()}; of permute(0,2,3,1): {x.permute(0, 2, 3, 1).reshape(-1, 4)[0].tolist()}")


def fact_plankton():
    kw = built("plankton_hwc_reshape_not_permute")
    print(f"  channel means of one image: {first_batch(kw)[0][0].mean((1, 2)).tolist()}")


def fact_traffic():
    kw = built("traffic_forecast_target_not_shifted")
    x, y = first_batch(kw)
    print(f"  target equals last input value: {torch.allclose(x[:, -1:], y)}")


def fact_nll():
    kw = built("garment_nllloss_on_raw_logits")
    x, y = first_batch(kw)
    out = kw["model"](x)
    print(f"  output row sums of exp: {out.exp().sum(1)[:3].tolist()}; NLLLoss = {kw['loss_fn'](out, y).item():.3f}")


def fact_mask():
    kw = built("lesion_mask_0_255_bce")
    print(f"  mask values: {first_batch(kw)[1].unique().tolist()}")


def fact_genre():
    kw = built("genre_multilabel_crossentropy")
    print(f"  positives per row (first 8): {first_batch(kw)[1].sum(1)[:8].tolist()}; loss {type(kw['loss_fn']).__name__}")


def fact_birds():
    kw = built("birds_labelencoder_refit_on_val")
    print(f"  val label ids used: {sorted(set(kw['val_loader'].dataset.tensors[1].tolist()))} (train has 0..5, val lacks 'crow')")


def fact_xray():
    kw = built("xray_head_replaced_after_optimizer")
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  head params in optimizer: {[id(p) in in_opt for p in kw['model'].head.parameters()]}")


def fact_ecg():
    import torch.nn as nn
    enc = nn.Sequential(nn.Linear(32, 8), nn.ReLU())
    res = enc.load_state_dict({"module.0.weight": torch.zeros(8, 32), "module.0.bias": torch.zeros(8)}, strict=False)
    print(f"  strict=False result: missing {res.missing_keys}, unexpected {res.unexpected_keys}")


def fact_gcn():
    kw = built("citation_gcn_numpy_roundtrip_in_forward")
    x, y = first_batch(kw)
    torch.nn.functional.cross_entropy(kw["model"](x), y).backward()
    print(f"  l1.weight.grad is None: {kw['model'].l1.weight.grad is None}")


def fact_recsys():
    m = built("recsys_user_table_plain_tensor")["model"]
    print(f"  registered parameters: {[n for n, _ in m.named_parameters()]}")


def fact_head():
    m = built("sensor_head_requires_grad_attribute")["model"]
    print(f"  head params requires_grad: {[p.requires_grad for p in m.head.parameters()]}")


def fact_lambdalr():
    kw = built("house_lambdalr_returns_lr_not_factor")
    print(f"  lr after the scheduler is built: {kw['optimizer'].param_groups[0]['lr']:.2e} (intended 1e-2)")


def fact_dropout():
    m = built("digits_dropout_keep_prob_0_9")["model"]
    print(f"  dropout p: {[mod.p for mod in m if isinstance(mod, torch.nn.Dropout)]}")


def fact_zero():
    kw = built("churn_all_weights_zero_init")
    x, y = first_batch(kw)
    torch.nn.functional.cross_entropy(kw["model"](x), y).backward()
    print(f"  first-layer grad norm {kw['model'][0].weight.grad.norm():.2e}; distinct hidden rows {kw['model'][0].weight.unique(dim=0).shape[0]}")


def fact_sum():
    kw = built("airquality_mse_reduction_sum_sgd")
    x, y = first_batch(kw)
    print(f"  reduction={kw['loss_fn'].reduction}, batch {len(y)}: loss {kw['loss_fn'](kw['model'](x), y).item():.1f}")


def fact_fdrop():
    kw = built("vibration_functional_dropout_training_true")
    m = kw["model"].eval()
    x = first_batch(kw)[0]
    print(f"  eval-mode outputs differ between two calls: {not torch.equal(m(x), m(x))}")


def fact_signs():
    kw = built("signs_val_pixels_not_scaled")
    print(f"  train max {first_batch(kw)[0].max():.2f}, val max {next(iter(kw['val_loader']))[0].max():.1f}")


def fact_arrows():
    kw = built("arrows_horizontal_flip_swaps_label")
    ds = kw["train_loader"].dataset
    print(f"  flip augmentation on: {ds.flip}; label 0 = left, 1 = right")


def fact_claims():
    kw = built("claims_get_dummies_per_split")
    print(f"  val one-hot column sums: {kw['val_loader'].dataset.tensors[0][:, 1:].sum(0).tolist()}")


def fact_faults():
    kw = built("faults_sorted_rows_split_without_shuffle")
    print(f"  train classes {sorted(set(kw['train_loader'].dataset.tensors[1].tolist()))}, "
          f"val classes {sorted(set(kw['val_loader'].dataset.tensors[1].tolist()))}")


def fact_soil():
    kw = built("soil_val_standardised_with_own_stats")
    print(f"  val feature means after scaling: {kw['val_loader'].dataset.tensors[0].mean(0)[:3].tolist()}")


for name, fn in {
    "har_lstm_seq_first": fact_har, "kws_spectrogram_view_not_transpose": fact_kws,
    "sentiment_conv1d_channels_are_tokens": fact_conv, "landcover_logits_view_without_permute": fact_seg,
    "plankton_hwc_reshape_not_permute": fact_plankton, "traffic_forecast_target_not_shifted": fact_traffic,
    "garment_nllloss_on_raw_logits": fact_nll, "lesion_mask_0_255_bce": fact_mask, "genre_multilabel_crossentropy": fact_genre,
    "birds_labelencoder_refit_on_val": fact_birds, "xray_head_replaced_after_optimizer": fact_xray,
    "ecg_checkpoint_module_prefix_strict_false": fact_ecg, "citation_gcn_numpy_roundtrip_in_forward": fact_gcn,
    "recsys_user_table_plain_tensor": fact_recsys, "sensor_head_requires_grad_attribute": fact_head,
    "house_lambdalr_returns_lr_not_factor": fact_lambdalr, "digits_dropout_keep_prob_0_9": fact_dropout,
    "churn_all_weights_zero_init": fact_zero, "airquality_mse_reduction_sum_sgd": fact_sum,
    "vibration_functional_dropout_training_true": fact_fdrop, "signs_val_pixels_not_scaled": fact_signs,
    "arrows_horizontal_flip_swaps_label": fact_arrows, "claims_get_dummies_per_split": fact_claims,
    "faults_sorted_rows_split_without_shuffle": fact_faults, "soil_val_standardised_with_own_stats": fact_soil,
}.items():
    FIXES[name]["fact"] = fn
