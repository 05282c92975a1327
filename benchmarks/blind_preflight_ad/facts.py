"""The fact each broken case rests on, printed by verify.py before the case is trained next to its fix."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained  # noqa: F401
from .registry import FIXES, load_all


def _kw(name, fixed=False):
    return load_all()[name].build() if not fixed else FIXES[name]["fixed"]()


def fact(name):
    def attach(fn):
        FIXES[name]["fact"] = fn
        return fn
    return attach


@fact("shapes_gru_seq_first_fed_batch_first")
def _():
    kw = _kw("shapes_gru_seq_first_fed_batch_first")
    x, _ = next(iter(kw["train_loader"]))
    print(f"  fact: batch {tuple(x.shape)} (B, T, F) into nn.GRU(batch_first={kw['model'].rnn.batch_first}): "
          f"dim 0 (size {x.shape[0]}) is read as time")


@fact("shapes_log_softmax_over_batch_axis")
def _():
    kw = _kw("shapes_log_softmax_over_batch_axis")
    x, _ = next(iter(kw["train_loader"]))
    p = kw["model"](x).exp()
    print(f"  fact: probabilities sum over classes to {p.sum(1)[:3].tolist()} (not 1); over the batch to "
          f"{p.sum(0).tolist()}")


@fact("shapes_token_logits_view_not_permute")
def _():
    t = torch.arange(6).view(1, 3, 2)     # (B=1, T=3, C=2)
    print(f"  fact: logits (T=3, C=2) {t[0].tolist()} -> view(1, 2, 3) {t.view(1, 2, 3)[0].tolist()} vs "
          f"permute {t.permute(0, 2, 1)[0].tolist()}")


@fact("shapes_time_major_logits_flattened_against_batch_major_labels")
def _():
    kw = _kw("shapes_time_major_logits_flattened_against_batch_major_labels")
    x, y = next(iter(kw["train_loader"]))
    print(f"  fact: logits {tuple(kw['model'](x).shape)} (T, B, C) flattened next to labels {tuple(y.shape)} (B, T)")


@fact("shapes_sequence_logits_class_axis_last")
def _():
    kw = _kw("shapes_sequence_logits_class_axis_last")
    x, y = next(iter(kw["train_loader"]))
    out = kw["model"](x)
    print(f"  fact: F.cross_entropy accepts logits {tuple(out.shape)} with targets {tuple(y.shape)}: "
          f"loss {F.cross_entropy(out, y).item():.3f}, dim 1 (days) taken as classes")


@fact("targets_binary_mask_255_ignored")
def _():
    kw = _kw("targets_binary_mask_255_ignored")
    _, y = next(iter(kw["train_loader"]))
    print(f"  fact: mask values {torch.unique(y).tolist()}, ignore_index=255: "
          f"{(y == 255).float().mean().item():.1%} of pixels (all the foreground) ignored")


@fact("targets_forecast_target_is_last_input")
def _():
    kw = _kw("targets_forecast_target_is_last_input")
    x, y = next(iter(kw["train_loader"]))
    print(f"  fact: target == last input value in {(x[:, -1, 0] == y).float().mean().item():.0%} of rows")


@fact("targets_multilabel_with_cross_entropy")
def _():
    kw = _kw("targets_multilabel_with_cross_entropy")
    _, y = next(iter(kw["train_loader"]))
    print(f"  fact: positives per row {y.sum(1).int().tolist()[:12]}..., loss {type(kw['loss_fn']).__name__}")


@fact("targets_class_weights_are_counts")
def _():
    kw = _kw("targets_class_weights_are_counts")
    print(f"  fact: class weights {[round(w, 3) for w in kw['loss_fn'].weight.tolist()]} for class shares 85/11/4%")


@fact("targets_regression_target_in_raw_dollars")
def _():
    kw = _kw("targets_regression_target_in_raw_dollars")
    x, y = next(iter(kw["train_loader"]))
    print(f"  fact: target mean {y.mean().item():,.0f}, initial predictions about {kw['model'](x).mean().item():.3f}")


@fact("trained_head_replaced_after_optimizer")
def _():
    kw = _kw("trained_head_replaced_after_optimizer")
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    head = list(kw["model"].head.parameters())
    print(f"  fact: new head tensors in the optimizer: {sum(id(p) in held for p in head)}/{len(head)}")


@fact("trained_checkpoint_prefix_mismatch_strict_false")
def _():
    res = cases_trained._backbone(7).load_state_dict(
        {"module." + k: v for k, v in cases_trained._backbone(100).state_dict().items()}, strict=False)
    print(f"  fact: strict=False load: missing {len(res.missing_keys)}, unexpected {len(res.unexpected_keys)}")


@fact("trained_factor_tables_not_parameters")
def _():
    kw = _kw("trained_factor_tables_not_parameters")
    print(f"  fact: registered parameters {[n for n, _ in kw['model'].named_parameters()]}")


@fact("trained_embedding_under_no_grad")
def _():
    kw = _kw("trained_embedding_under_no_grad")
    x, y = next(iter(kw["train_loader"]))
    F.cross_entropy(kw["model"](x), y).backward()
    print(f"  fact: embedding grad after backward: {kw['model'].emb.weight.grad}")


@fact("trained_hidden_state_detached_every_step")
def _():
    print("  fact: h = cell(x_t, h.detach()) at each of the 16 steps: dL/dx_0 is zero")


@fact("mechanics_warmup_factor_never_capped")
def _():
    kw = _kw("mechanics_warmup_factor_never_capped")
    for _ in range(300):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print(f"  fact: lr after 300 steps {kw['scheduler'].get_last_lr()[0]:.3g} (base 0.05)")


@fact("mechanics_weights_cast_to_bfloat16")
def _():
    w = torch.tensor([0.08], dtype=torch.bfloat16)
    print(f"  fact: bf16 0.08 + 1e-4 = {(w + 1e-4).item()} (unchanged: {(w + 1e-4).item() == w.item()})")


@fact("mechanics_loss_summed_over_batch")
def _():
    print("  fact: .sum() over a 128 x 8 batch = 1024 x .mean(): the SGD step is 1024 times larger")


@fact("mechanics_accumulation_scaled_twice")
def _():
    print("  fact: loss_fn returns loss / 8 and the loop divides by accumulation_steps=8 again: gradient x 1/8")


@fact("mechanics_lambdalr_returns_learning_rate")
def _():
    kw = _kw("mechanics_lambdalr_returns_learning_rate")
    print(f"  fact: lr at step 0 = {kw['optimizer'].param_groups[0]['lr']:.3g} (the user meant 1e-3)")


@fact("data_vocabulary_rebuilt_on_validation_split")
def _():
    tr, _ = cases_data._texts(2048, 1)
    va, _ = cases_data._texts(512, 2)
    a, b = cases_data.build_vocab(tr), cases_data.build_vocab(va)
    print(f"  fact: words with a different id in the validation vocabulary: {sum(a[w] != b.get(w) for w in a)}/{len(a)}")


@fact("data_uint8_pixels_not_scaled")
def _():
    kw = _kw("data_uint8_pixels_not_scaled")
    x, _ = next(iter(kw["train_loader"]))
    print(f"  fact: input range {x.min().item():.0f}..{x.max().item():.0f}")


@fact("data_last_step_of_right_padded_batch")
def _():
    kw = _kw("data_last_step_of_right_padded_batch")
    ids, lengths, _ = next(iter(kw["train_loader"]))
    print(f"  fact: out[:, -1] is position {ids.shape[1] - 1}; {(lengths < ids.shape[1]).sum().item()}/{len(lengths)} "
          f"sessions end earlier (median pad run {int((ids.shape[1] - lengths).median())} steps)")


@fact("data_sorted_table_split_by_slicing")
def _():
    kw = _kw("data_sorted_table_split_by_slicing")
    ys = torch.cat([b[1] for b in kw["train_loader"]])
    print(f"  fact: classes in the training slice {torch.unique(ys).tolist()} of 0..4")


@fact("data_flip_augmentation_not_applied_to_keypoint")
def _():
    print("  fact: a flipped 16-px image puts the blob at col 15 - c while the target keeps col c")
