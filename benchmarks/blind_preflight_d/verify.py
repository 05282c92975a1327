"""Facts behind set d's broken cases, checked without the preflight: the shapes the loss sees,
what the data holds, and the case trained next to its one-line fix (same steps, same data).

    .venv/bin/python -m benchmarks.blind_preflight_d.verify [NAME ...]
"""

from __future__ import annotations

import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.blind_preflight_d import cases_data as D  # noqa: F401 (registers its cases)
from benchmarks.blind_preflight_d import cases_shapes_targets as S
from benchmarks.blind_preflight_d import cases_trained_mechanics as M  # noqa: F401 (registers its cases)
from benchmarks.blind_preflight_d.registry import load_all
from benchmarks.blind_preflight_d.sanity import run_case

CASES = load_all()


def train(kw, steps=120):
    class C:  # a Case-like wrapper for sanity.run_case
        build = staticmethod(lambda: kw)
    losses, model = run_case(C, steps)
    return sum(losses[:3]) / 3, sum(losses[-5:]) / 5, model


def acc(model, loader, fwd=None):
    model.eval()
    right = n = 0
    with torch.no_grad():
        for batch in loader:
            x, y = batch[0], batch[-1]
            out = fwd(model, batch) if fwd else model(x)
            right += (out.argmax(-1) == y).sum().item()
            n += y.numel()
    model.train()
    return right / n


def compare(name, fixed_kw, steps=120, metric=None):
    b0, b1, bm = train(CASES[name].build(), steps)
    f0, f1, fm = train(fixed_kw, steps)
    extra = ""
    if metric:
        extra = f" | metric broken {metric(bm):.3f} fixed {metric(fm):.3f}"
    print(f"  broken loss {b0:.4g} -> {b1:.4g}; fixed loss {f0:.4g} -> {f1:.4g} ({steps} steps){extra}")


def v_turbine():
    kw = CASES["turbine_conv1d_head_b11_vs_b"].build()
    x, y = next(iter(kw["train_loader"]))
    print("  pred", tuple(kw["model"](x).shape), "target", tuple(y.shape),
          "broadcast", tuple(torch.broadcast_shapes(kw["model"](x).shape, y.shape)))
    fixed = CASES["turbine_conv1d_head_b11_vs_b"].build()
    fixed["loss_fn"] = lambda m, b: F.mse_loss(m(b[0]).view(-1), b[1])
    compare("turbine_conv1d_head_b11_vs_b", fixed)


def v_depth():
    kw = CASES["depth_net_b1hw_vs_bhw"].build()
    x, y = next(iter(kw["train_loader"]))
    p = kw["model"](x)
    print("  pred", tuple(p.shape), "target", tuple(y.shape), "broadcast", tuple(torch.broadcast_shapes(p.shape, y.shape)))
    fixed = CASES["depth_net_b1hw_vs_bhw"].build()
    fixed["loss_fn"] = lambda m, b: F.mse_loss(m(b[0]).squeeze(1), b[1])
    compare("depth_net_b1hw_vs_bhw", fixed)


def v_attn():
    kw = CASES["review_attention_pool_softmax_over_batch"].build()
    m = kw["model"].eval()
    x, _ = next(iter(kw["train_loader"]))
    a = m(x)[0]
    x2 = x.clone()
    x2[1:] = torch.randint(10, 200, x2[1:].shape)
    print("  sample 0's logits move when the other samples change:", not torch.allclose(a, m(x2)[0]))

    class Fixed(S.AttentionPoolClassifier):
        def forward(self, ids):
            h = self.embed(ids)
            w = torch.softmax(self.score(h).squeeze(-1), dim=1)
            return self.head((w.unsqueeze(-1) * h).sum(1))
    fixed = CASES["review_attention_pool_softmax_over_batch"].build()
    torch.manual_seed(2)
    fixed["model"] = Fixed()
    fixed["optimizer"] = torch.optim.Adam(fixed["model"].parameters(), lr=3e-3)
    compare("review_attention_pool_softmax_over_batch", fixed, 300)
    _, _, bm = train(CASES["review_attention_pool_softmax_over_batch"].build(), 300)
    bm.eval()
    ids, y = kw["train_loader"].dataset.tensors
    with torch.no_grad():
        batched = (torch.cat([bm(ids[i:i + 64]) for i in range(0, 512, 64)]).argmax(1) == y[:512]).float().mean()
        single = (torch.cat([bm(ids[i:i + 1]) for i in range(512)]).argmax(1) == y[:512]).float().mean()
    print(f"  broken model accuracy: in batches of 64 {batched:.3f}, one review at a time {single:.3f}")


def v_distill():
    name = "distill_student_log_softmax_batch_dim"
    kw = CASES[name].build()
    fixed = CASES[name].build()
    # the fix: log_softmax over dim=-1; reuse the broken loss's teacher (a closure cell)
    cells = {c.cell_contents.__class__.__name__: c.cell_contents for c in kw["loss_fn"].__closure__}
    teacher = cells["Sequential"]

    def fixed_loss(model, batch):
        with torch.no_grad():
            soft = F.softmax(teacher(batch[0]) / 2.0, dim=-1)
        return F.kl_div(F.log_softmax(model(batch[0]) / 2.0, dim=-1), soft, reduction="batchmean") * 4
    fixed["loss_fn"] = fixed_loss
    b0, b1, bm = train(kw, 300)
    f0, f1, fm = train(fixed, 300)
    with torch.no_grad():
        x, y = kw["train_loader"].dataset.tensors
        agree = lambda m: (m(x).argmax(1) == teacher(x).argmax(1)).float().mean().item()  # noqa: E731
        print(f"  teacher agreement after 300 steps: broken {agree(bm):.3f}, fixed {agree(fm):.3f}")


def v_lstm():
    name = "sensor_lstm_missing_batch_first_last_step"
    fixed = CASES[name].build()
    torch.manual_seed(4)
    m = S.LSTMClassifier()
    m.lstm = nn.LSTM(8, 32, batch_first=True)
    fixed["model"], fixed["optimizer"] = m, torch.optim.Adam(m.parameters(), lr=3e-3)
    compare(name, fixed, 200)


def v_relevance():
    name = "relevance_target_unsqueezed_wrong_axis"
    fixed = CASES[name].build()
    fixed["loss_fn"] = lambda m, b: F.mse_loss(m(b[0]), b[1].unsqueeze(1))
    compare(name, fixed, 200)


def v_pets():
    kw = CASES["pets_label_from_wrong_path_component"].build()
    ds = kw["train_loader"].dataset
    print("  class_to_idx", ds.class_to_idx, "distinct labels", set(ds.labels))


def v_tags():
    name = "product_tags_softmax_then_bce"
    fixed = CASES[name].build()
    fixed["loss_fn"] = lambda m, b: F.binary_cross_entropy_with_logits(m(b[0]), b[1])
    x, y = CASES[name].build()["train_loader"].dataset.tensors
    print("  tags per product", y.sum(1).float().mean().item())

    b0, b1, bm = train(CASES[name].build(), 300)
    f0, f1_, fm = train(fixed, 300)
    with torch.no_grad():
        sb = torch.softmax(bm(x), 1)
        top = (sb > 0.5).float().sum(1).mean().item()
        recall_f = ((torch.sigmoid(fm(x)) > 0.5).float() * y).sum() / y.sum()
    print(f"  broken: mean tags with p>0.5 per product {top:.2f}; fixed recall {recall_f:.3f}")


def v_pos():
    kw = CASES["pos_tagger_ignore_index_minus1_pads_minus100"].build()
    _, tags = next(iter(kw["train_loader"]))
    print("  tag values in batch:", sorted(set(tags.flatten().tolist()))[:3], "... ignore_index=-1")


def v_libsvm():
    b0, b1, _ = train(CASES["adult_libsvm_labels_minus_one_bce"].build(), 400)
    print(f"  loss over 400 steps {b0:.4g} -> {b1:.4g} (a 0/1 BCE cannot go below 0)")


def v_ctr():
    kw = CASES["ctr_percent_targets_into_bce"].build()
    print("  target range", kw["train_loader"].dataset.tensors[1].min().item(), kw["train_loader"].dataset.tensors[1].max().item())


def v_translation():
    name = "translation_gru_decoder_fed_unshifted_targets"
    kw = CASES[name].build()
    b0, b1, m = train(kw, 150)
    src, tgt = kw["train_loader"].dataset.tensors
    with torch.no_grad():
        # at inference there is no target to read: feed a constant decoder input
        inf = m(src[:512], torch.full_like(tgt[:512], 1)).argmax(-1)
    print(f"  loss {b0:.3g} -> {b1:.3g}; accuracy without the target as decoder input "
          f"{(inf == tgt[:512]).float().mean().item():.3f}")


def v_demand():
    kw = CASES["demand_window_includes_target_step"].build()
    x, y = kw["train_loader"].dataset.tensors
    print("  x[:, -1] == y for every window:", torch.equal(x[:, -1], y))


def v_csv():
    name = "csv_features_skip_header_labels_dont"
    fixed = CASES[name].build()
    from benchmarks.blind_preflight_d.registry import loader, teacher_classes
    x, y = teacher_classes(3001, 20, 4, s=13)
    fixed["train_loader"] = loader(torch.utils.data.TensorDataset(x[1:], y[1:]), 64)
    compare(name, fixed, 200)


def v_head_forward():
    kw = CASES["head_linear_constructed_inside_forward"].build()
    print("  parameters in the model:", [n for n, _ in kw["model"].named_parameters()][-2:])


def v_ema():
    kw = CASES["ema_copy_given_to_optimizer"].build()
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  model params in optimizer:", sum(id(p) in ids for p in kw["model"].parameters()))


def v_unfreeze():
    kw = CASES["gradual_unfreeze_typo_requires_grad_underscore"].build()
    print("  trainable params:", sum(p.requires_grad for p in kw["model"].parameters()))


def v_t5():
    from benchmarks.blind_preflight_d.cases_trained_mechanics import _t5_reverse_batches  # noqa: F401
    name = "t5_dropout_rate_from_keep_prob"
    fixed = CASES[name].build()
    for m in fixed["model"].modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.1
    compare(name, fixed, 80)


def v_wd():
    name = "sgd_weight_decay_5_instead_of_5e4"
    fixed = CASES[name].build()
    fixed["optimizer"] = torch.optim.SGD(fixed["model"].parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    compare(name, fixed, 150)


def v_eps():
    name = "adam_eps_one_from_inception_advice"
    fixed = CASES[name].build()
    fixed["optimizer"] = torch.optim.Adam(fixed["model"].parameters(), lr=1e-3)
    compare(name, fixed, 150)


def v_lr0():
    kw = CASES["finetune_head_group_inherits_lr_zero"].build()
    print("  group lrs:", [g["lr"] for g in kw["optimizer"].param_groups])


def v_numpy():
    name = "feature_numpy_roundtrip_in_forward"
    kw = CASES[name].build()
    before = [p.detach().clone() for p in kw["model"].encoder.parameters()]
    _, _, m = train(kw, 20)
    print("  encoder unchanged after 20 steps:", all(torch.equal(a, b) for a, b in zip(before, m.encoder.parameters())))


def v_clip():
    name = "sgd_clip_grad_norm_1e4"
    fixed = CASES[name].build()
    fixed["clip_grad_norm"] = 1.0
    compare(name, fixed, 150)


def v_warmup():
    kw = CASES["warmup_lambda_integer_division"].build()
    s = kw["scheduler"]
    lrs = []
    for _ in range(1000):
        lrs.append(kw["optimizer"].param_groups[0]["lr"])
        kw["optimizer"].step()
        s.step()
    print("  max lr over the 1000 planned steps:", max(lrs))


def v_multitask():
    name = "multitask_loss_rebuilt_with_torch_tensor"
    kw = CASES[name].build()
    before = [p.detach().clone() for p in kw["model"].parameters()]
    _, _, m = train(kw, 20)
    print("  weights unchanged after 20 steps:", all(torch.equal(a, b) for a, b in zip(before, m.parameters())))


def v_maximize():
    b0, b1, _ = train(CASES["adam_maximize_flag_from_reward_code"].build(), 150)
    print(f"  loss {b0:.3g} -> {b1:.3g}")


def v_cleansgd():
    name = "custom_sgd_step_clears_grads_first"
    kw = CASES[name].build()
    before = [p.detach().clone() for p in kw["model"].parameters()]
    _, _, m = train(kw, 20)
    print("  weights unchanged after 20 steps:", all(torch.equal(a, b) for a, b in zip(before, m.parameters())))


def v_split():
    kw = CASES["two_randperm_calls_overlapping_split"].build()
    tr, va = set(kw["train_loader"].dataset.indices), set(kw["val_loader"].dataset.indices)
    print(f"  validation rows also in train: {len(tr & va)}/{len(va)}")


def v_dist():
    kw = CASES["distributed_sampler_hardcoded_8_replicas"].build()
    e1, e2 = list(kw["train_loader"].sampler), list(kw["train_loader"].sampler)
    print(f"  samples per epoch {len(e1)} of {len(kw['train_loader'].dataset)}; same set in two epochs: {set(e1) == set(e2)}")


def v_impute():
    kw = CASES["tabular_nan_imputation_any_replaces_all"].build()
    x, _ = kw["train_loader"].dataset.tensors
    print("  distinct input rows:", torch.unique(x, dim=0).shape[0])


def v_aug(name, classes):
    kw = CASES[name].build()
    b0, b1, _ = train(kw, 200)
    ds = kw["train_loader"].dataset
    print(f"  loss {b0:.3g} -> {b1:.3g} over 200 steps; ln(C) = {torch.log(torch.tensor(float(classes))).item():.3f}")
    fixed = CASES[name].build()
    plain = torch.utils.data.TensorDataset(ds.images, ds.labels)
    from benchmarks.blind_preflight_d.registry import loader
    fixed["train_loader"] = loader(plain, 32)
    f0, f1, _ = train(fixed, 200)
    print(f"  without the augmentation: {f0:.3g} -> {f1:.3g}")


def v_uint8():
    kw = CASES["uint8_images_floor_divided_by_255"].build()
    x, _ = next(iter(kw["train_loader"]))
    print("  max pixel in the batch:", x.max().item())


def v_std():
    kw = CASES["sensor_standardise_zero_std_column"].build()
    x, _ = kw["train_loader"].dataset.tensors
    print("  NaN columns:", torch.isnan(x).all(0).nonzero().flatten().tolist())


def v_collate():
    name = "packed_gru_collate_sorts_inputs_not_labels"
    fixed = CASES[name].build()

    def good_collate(batch):
        batch = sorted(batch, key=lambda b: len(b[0]), reverse=True)
        seqs = [b[0] for b in batch]
        return (torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True), torch.tensor([len(s) for s in seqs]),
                torch.tensor([b[1] for b in batch]))
    from benchmarks.blind_preflight_d.registry import loader
    fixed["train_loader"] = loader(fixed["train_loader"].dataset, 32, collate_fn=good_collate)
    compare(name, fixed, 200)


CHECKS = {
    "turbine_conv1d_head_b11_vs_b": v_turbine, "depth_net_b1hw_vs_bhw": v_depth,
    "review_attention_pool_softmax_over_batch": v_attn, "distill_student_log_softmax_batch_dim": v_distill,
    "sensor_lstm_missing_batch_first_last_step": v_lstm, "relevance_target_unsqueezed_wrong_axis": v_relevance,
    "pets_label_from_wrong_path_component": v_pets, "adult_libsvm_labels_minus_one_bce": v_libsvm,
    "product_tags_softmax_then_bce": v_tags, "pos_tagger_ignore_index_minus1_pads_minus100": v_pos,
    "ctr_percent_targets_into_bce": v_ctr, "translation_gru_decoder_fed_unshifted_targets": v_translation,
    "demand_window_includes_target_step": v_demand, "csv_features_skip_header_labels_dont": v_csv,
    "head_linear_constructed_inside_forward": v_head_forward, "ema_copy_given_to_optimizer": v_ema,
    "gradual_unfreeze_typo_requires_grad_underscore": v_unfreeze, "t5_dropout_rate_from_keep_prob": v_t5,
    "sgd_weight_decay_5_instead_of_5e4": v_wd, "adam_eps_one_from_inception_advice": v_eps,
    "finetune_head_group_inherits_lr_zero": v_lr0, "feature_numpy_roundtrip_in_forward": v_numpy,
    "sgd_clip_grad_norm_1e4": v_clip, "warmup_lambda_integer_division": v_warmup,
    "multitask_loss_rebuilt_with_torch_tensor": v_multitask, "adam_maximize_flag_from_reward_code": v_maximize,
    "custom_sgd_step_clears_grads_first": v_cleansgd, "two_randperm_calls_overlapping_split": v_split,
    "distributed_sampler_hardcoded_8_replicas": v_dist, "tabular_nan_imputation_any_replaces_all": v_impute,
    "arrow_direction_random_hflip": lambda: v_aug("arrow_direction_random_hflip", 2),
    "status_led_channel_shuffle_augment": lambda: v_aug("status_led_channel_shuffle_augment", 3),
    "uint8_images_floor_divided_by_255": v_uint8, "sensor_standardise_zero_std_column": v_std,
    "packed_gru_collate_sorts_inputs_not_labels": v_collate,
}

if __name__ == "__main__":
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    for n in sys.argv[1:] or list(CHECKS):
        print(n)
        try:
            CHECKS[n]()
        except Exception as e:  # noqa: BLE001
            print(f"  RAISED {type(e).__name__}: {str(e)[:200]}")
