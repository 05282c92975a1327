"""Facts behind set ac's broken cases, printed by ``verify.py`` before each case trains (no preflight involved)."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_ac import cases_data as D
from benchmarks.blind_preflight_ac import cases_mechanics as M
from benchmarks.blind_preflight_ac import cases_shapes as S
from benchmarks.blind_preflight_ac import cases_targets as T
from benchmarks.blind_preflight_ac import cases_trained as W
from benchmarks.blind_preflight_ac.registry import FIXES, load_all

load_all()


def attach(name):
    def register(fn):
        FIXES[name]["fact"] = fn
        return fn
    return register


@attach("lstm_missing_batch_first")
def _():
    lstm = nn.LSTM(3, 4)
    out, _ = lstm(torch.randn(32, 20, 3))
    print(f"  fact: LSTM(batch_first=False) on (32, 20, 3) -> out {tuple(out.shape)}; out[:, -1] is "
          f"{tuple(out[:, -1].shape)} = state of 'batch row' 19 after 'time' i (the samples)")


@attach("nhwc_reshaped_not_permuted")
def _():
    x = torch.arange(12 * 12 * 3).reshape(1, 12, 12, 3)
    r, p = x.reshape(1, 3, 12, 12), x.permute(0, 3, 1, 2)
    print(f"  fact: reshape plane 0 row 0 = {r[0, 0, 0, :6].tolist()} (channels interleaved); permute plane 0 row 0 "
          f"= {p[0, 0, 0, :6].tolist()}")


@attach("seq_first_logits_flattened_against_batch_first_labels")
def _():
    t = torch.arange(2 * 3).reshape(2, 3)      # sample b, step t -> 3b + t
    print(f"  fact: (time, batch) flattened {t.t().reshape(-1).tolist()} vs (batch, time) flattened "
          f"{t.reshape(-1).tolist()}")


@attach("mean_pooled_over_embedding_dim")
def _():
    e = torch.randn(5, S.MAX_LEN, 24)
    print(f"  fact: e {tuple(e.shape)}; e.mean(dim=2) -> {tuple(e.mean(2).shape)} (one number per token); "
          f"e.mean(dim=1) -> {tuple(e.mean(1).shape)}")


@attach("last_step_of_right_padded_batch")
def _():
    ids, lengths, _ = S.padded_reviews(200, 5)
    print(f"  fact: share of reviews whose position 59 is padding: {(lengths < S.PAD_LEN).float().mean():.2f}; "
          f"mean pad run {(S.PAD_LEN - lengths).float().mean():.1f} steps")


@attach("label_column_minmax_scaled")
def _():
    x, y = T.wine_table(2000, 11)
    scaled = T.minmax_all_columns(torch.cat([x, y.float().unsqueeze(1)], 1))[:, -1]
    print(f"  fact: grades {torch.bincount(y).tolist()} -> after scaling and .long(): "
          f"{torch.bincount(scaled.long()).tolist()}")


@attach("mse_regression_on_class_ids")
def _():
    print("  fact: MSE of predicting 2.0 for a sample of class 0 or 4 is 4.0; the squared error rewards averaging "
          "between unordered ids")


@attach("forecast_target_not_shifted")
def _():
    x, nxt, last = T.load_windows(2400, 13)
    print(f"  fact: target == x[:, -1] exactly: {bool((last == x[:, -1]).all())}; RMSE of copying the last input "
          f"against the real next value {((x[:, -1] - nxt) ** 2).mean().sqrt():.3f}")


@attach("multilabel_tags_argmaxed_into_crossentropy")
def _():
    _, tags = T.tagged_posts(400, 14)
    print(f"  fact: mean tags per post {tags.sum(1).mean():.2f}; argmax keeps 1 of them")


@attach("pos_weight_inverted")
def _():
    _, y = T.fraud_table(3000, 15)
    n_pos = y[:2400].sum()
    print(f"  fact: positives {int(n_pos)}/2400; pos_weight used {float(n_pos / (2400 - n_pos)):.3f}, intended "
          f"{float((2400 - n_pos) / n_pos):.1f}")


@attach("head_replaced_after_optimizer_built")
def _():
    kw = W.head_replaced_after_optimizer_built()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  fact: model tensors with requires_grad held by the optimizer: "
          f"{sum(id(p) in held for p in kw['model'].parameters() if p.requires_grad)} of "
          f"{sum(p.requires_grad for p in kw['model'].parameters())}")


@attach("random_vectors_frozen_by_from_pretrained")
def _():
    e = nn.Embedding.from_pretrained(torch.randn(4, 2))
    print(f"  fact: nn.Embedding.from_pretrained(...).weight.requires_grad = {e.weight.requires_grad}")


@attach("hidden_weights_plain_tensors_not_parameters")
def _():
    print(f"  fact: registered parameters: {[n for n, _ in W.ChurnNet(False).named_parameters()]}")


@attach("encoder_forward_under_no_grad")
def _():
    m = W.VibrationNet(False)
    m(torch.randn(4, 2, 48)).sum().backward()
    print(f"  fact: encoder grads after backward: {[p.grad for p in m.encoder.parameters()][:2]}")


@attach("optimizer_from_earlier_model_instance")
def _():
    kw = W.optimizer_from_earlier_model_instance()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  fact: model parameters held by the optimizer: {sum(id(p) in held for p in kw['model'].parameters())}"
          f" of {len(list(kw['model'].parameters()))}")


@attach("nllloss_on_raw_logits")
def _():
    print(f"  fact: NLLLoss on logits [[5., 0., 0.]] for class 0 = {nn.NLLLoss()(torch.tensor([[5., 0., 0.]]), torch.tensor([0])).item()}"
          " (negative, unbounded)")


@attach("lambdalr_returns_lr_not_factor")
def _():
    kw = M.lambdalr_returns_lr_not_factor()
    print(f"  fact: LR at step 0 = {kw['optimizer'].param_groups[0]['lr']:.1e}")


@attach("adam_eps_one")
def _():
    kw = M.adam_eps_one()
    print(f"  fact: Adam eps = {kw['optimizer'].param_groups[0]['eps']}; typical grad magnitude here ~1e-2, so "
          "sqrt(v) << eps")


@attach("relu_on_regression_output")
def _():
    _, y = M.temperature_windows(2000, 34)
    print(f"  fact: share of negative targets {(y < 0).float().mean():.2f}; the last layer is ReLU (outputs >= 0)")


@attach("constant_weight_init")
def _():
    kw = M.constant_weight_init()
    w = kw["model"][0].weight
    print(f"  fact: distinct rows in the first layer: {torch.unique(w, dim=0).shape[0]} of {w.shape[0]}")


@attach("validation_features_not_standardized")
def _():
    kw = D.validation_features_not_standardized()
    xt, xv = kw["train_loader"].dataset.tensors[0], kw["val_loader"].dataset.tensors[0]
    print(f"  fact: train feature means {xt.mean(0)[:3].tolist()} vs validation {xv.mean(0)[:3].tolist()}")


@attach("max_length_truncates_signal")
def _():
    ids, _ = D.long_reviews(400, 42)
    print(f"  fact: opinion words (ids 2..9) among the first 16 tokens: {int((ids[:, :16] < 10).sum())}, after: "
          f"{int((ids[:, 16:] < 10).sum())}")


@attach("raw_unix_timestamp_feature")
def _():
    x, _ = D.delivery_log(400, 43)
    print(f"  fact: column std {x.std(0)[:3].tolist()} ... timestamp mean {x[:, 7].mean():.3e}")


@attach("hflip_augmentation_swaps_left_right_classes")
def _():
    x, y = D.arrow_icons(8, 44)
    i = int((y == 0).nonzero()[0])
    flipped = x[i].flip(-1)
    print("  fact: a flipped 'left' icon's mean column profile correlates with 'right':",
          f"{torch.corrcoef(torch.stack([flipped[0].mean(0), x[i, 0].mean(0).flip(0)]))[0, 1]:.2f}")


@attach("vocab_rebuilt_on_validation_texts")
def _():
    texts, _ = D.ticket_texts(1800, 45)
    a, b = D.build_vocab(texts[:1400]), D.build_vocab(texts[1400:])
    shared = [w for w in b if w in a]
    print(f"  fact: words shared by both vocabularies with the same id: {sum(a[w] == b[w] for w in shared)} of "
          f"{len(shared)}")
