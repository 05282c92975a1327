"""The fact each broken case of set ba rests on (printed by ``verify.py`` before the broken and fixed runs), and the
one-line fixes with the metric both runs are scored on (``FIXES``)."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_ba import (
    cases_data,
    cases_mechanics,
    cases_shapes,
    cases_targets,
    cases_trained,
)
from benchmarks.blind_preflight_ba.registry import (
    acc_of,
    fix,
    fixed_of,
    q_rmse,
    retrieval_acc,
    rmse_of,
    rtg,
    value_rmse,
)


def first_batch(builder, fixed=False):
    kw = builder(fixed=fixed)
    return kw, next(iter(kw["train_loader"]))


# ---------------------------------------------------------------- shapes
def fact_bc_steering():
    kw, (x, a) = first_batch(cases_shapes.bc_steering_mse_broadcast)
    out = kw["model"](x)
    print(f"  policy output {tuple(out.shape)}, actions {tuple(a.shape)}, (out - a) {tuple((out - a).shape)}")


def fact_fqe_broadcast():
    kw, batch = first_batch(cases_shapes.fqe_td_target_broadcast)
    q = kw["model"](batch[0]).gather(1, batch[1].unsqueeze(1))
    print(f"  Q(s,a) {tuple(q.shape)}, TD target {tuple(batch[2].shape)}, difference {tuple((q - batch[2]).shape)}")


def fact_rtg_dim():
    _, (x, y) = first_batch(cases_shapes.rtg_discounted_sum_over_batch_axis)
    _, (xf, yf) = first_batch(cases_shapes.rtg_discounted_sum_over_batch_axis, True)
    print(f"  value target std broken {y.std():.2f} vs correct {yf.std():.2f}; the scan walked dim 0 (episodes)")


def fact_frames():
    img = torch.arange(2 * 2 * 3).reshape(1, 2, 2, 3)
    print("  HWC pixel (0,0) =", img[0, 0, 0].tolist(), "; reshape -> channel 0 =", img.reshape(1, 3, 2, 2)[0, 0]
          .flatten().tolist(), "; permute -> channel 0 =", img.permute(0, 3, 1, 2)[0, 0].flatten().tolist())


def fact_batch_first():
    layer = nn.TransformerEncoderLayer(8, 2, 16)
    print(f"  nn.TransformerEncoderLayer batch_first default = {layer.self_attn.batch_first}: a (B, T, D) input is "
          "read as (T=B, B=T, D), attention runs across the batch")


# ---------------------------------------------------------------- targets
def fact_terminals():
    kw, batch = first_batch(cases_targets.fqe_bootstraps_through_terminals)
    print(f"  {int(batch[4].sum())}/{len(batch[4])} terminal transitions in a batch still get gamma * max Q(s') "
          "added to their target")


def fact_rtg_start():
    r = torch.ones(1, 20)
    good = rtg(r)[0]
    disc = 0.9 ** torch.arange(20).float()
    bad = torch.flip(torch.cumsum(torch.flip(r * disc, [1]), 1), [1])[0]
    print(f"  constant reward 1: correct RTG at t=10 {good[10]:.2f}, gamma**k-from-start {bad[10]:.2f}")


def fact_boundaries():
    x, rew, done = cases_targets.flat_buffer(0)
    good = cases_targets.buffer_returns(rew, done)
    bad = cases_targets.buffer_returns(rew, done, reset=False)
    last = done.bool()
    print(f"  mean |error| of the return at the last step of an episode: {(bad - good)[last].abs().mean():.2f} "
          f"(reward scale {rew.abs().mean():.2f})")


def fact_awr_sign():
    kw, (s, a, r) = first_batch(cases_targets.awr_advantage_sign_flipped)
    print(f"  corr(weight, reward) with adv = V - R at V=0: {torch.corrcoef(torch.stack([torch.exp(-r / 0.5), r]))[0, 1]:.2f}")


def fact_clip_targets():
    kw, (img, cap, cls) = first_batch(cases_targets.clip_targets_are_class_ids)
    print(f"  targets for the (64, 64) logits: {cls[:10].tolist()} ... vs arange {list(range(10))} ...")


# ---------------------------------------------------------------- what is trained
def fact_target_opt():
    kw = cases_trained.fqe_optimizer_holds_target_net()
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  online params in the optimizer: {sum(id(p) in ids for p in kw['model'].online.parameters())}, "
          f"target params: {sum(id(p) in ids for p in kw['model'].target.parameters())}; "
          f"target requires_grad: {next(kw['model'].target.parameters()).requires_grad}")


def fact_freeze():
    kw = cases_trained.fusion_freeze_filter_freezes_text_encoder()
    print("  trainable:", [n for n, p in kw["model"].named_parameters() if p.requires_grad])


def fact_head():
    kw = cases_trained.bc_head_replaced_after_optimizer()
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  new head weight in optimizer: {id(kw['model'][4].weight) in ids}")


def fact_proj():
    kw = cases_trained.fusion_projection_built_in_forward()
    m, b = kw["model"], next(iter(kw["train_loader"]))
    m(b[:2])
    w1 = m.text_proj.weight.clone()
    m(b[:2])
    print(f"  text_proj weight changed between two forwards without a step: {not torch.equal(w1, m.text_proj.weight)}")


def fact_log_std():
    kw = cases_trained.bc_log_std_not_a_parameter()
    print(f"  log_std in model.parameters(): {any(p is kw['model'].log_std for p in kw['model'].parameters())}")


# ---------------------------------------------------------------- mechanics
def fact_soft_update():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    before = b.weight.clone()
    cases_mechanics.soft_update(a, b, 0.05)
    print(f"  soft_update(online, target): target unchanged = {torch.equal(before, b.weight)}; the online weights "
          "move 5% toward the target")


def fact_warmup():
    kw = cases_mechanics.clip_warmup_longer_than_run()
    for _ in range(300):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print(f"  lr after 300 steps: {kw['optimizer'].param_groups[0]['lr']:.2e} (peak 2e-3)")


def fact_detach():
    kw, batch = first_batch(cases_mechanics.fqe_detach_on_wrong_side)
    q = kw["model"](batch[0]).gather(1, batch[1][:, None]).squeeze(1)
    print(f"  q.detach().requires_grad = {q.detach().requires_grad}; the gradient only reaches max Q(s')")


def fact_modality():
    kw = cases_mechanics.modality_dropout_active_at_eval()
    m, b = kw["model"], next(iter(kw["val_loader"]))
    m.eval()
    torch.manual_seed(0)
    outs = [m(b[:2]) for _ in range(4)]
    print(f"  eval outputs differ between identical forwards: {not all(torch.equal(outs[0], o) for o in outs)}")


def fact_accum():
    kw = cases_mechanics.clip_accumulation_shrinks_negatives()
    print(f"  micro-batch {kw['train_loader'].batch_size} x {kw['accumulation_steps']}: "
          f"{kw['train_loader'].batch_size - 1} negatives per InfoNCE term (63 with one batch of 64)")


# ---------------------------------------------------------------- data
def fact_shuffle():
    x, rew, done = cases_targets.flat_buffer(0)
    print(f"  after the shuffle, {int(done.sum())} done flags fall at random places among {len(done)} rows: the "
          "backward scan adds unrelated rewards")


def fact_chunks():
    _, chunks = cases_data.reach_chunks(4, 0)
    print(f"  per-chunk min/max of 4 chunks: {chunks.min(1).values.tolist()} / {chunks.max(1).values.tolist()}")


def fact_off_by_one():
    obs, act = cases_data.driving_log(2, 0)
    print(f"  actions of episode 0: {act[0, :6].tolist()}; paired with obs 0..4: {act[0, 1:6].tolist()}")


def fact_captions():
    kw = cases_data.clip_captions_in_different_order()
    img, cap, _ = kw["train_loader"].dataset.tensors
    from benchmarks.blind_preflight_ba.registry import pairs
    _, cap0, _ = pairs(2000)
    print(f"  pairs whose caption is still their own: {(cap == cap0).all(1).float().mean():.3f}")


def fact_timeouts():
    x, a, r, x2, term, tout = cases_data.q_transitions(3000, timeouts=0.5)
    print(f"  terminal {int(term.sum())}, time-limit truncations {int(tout.sum())} of {len(term)} transitions")


def _acc_inputs2(m, b):
    return m(b[:2]).argmax(-1), b[2]


Q = dict(metric=q_rmse, label="val RMSE to Q*", higher=False)
V = dict(metric=value_rmse, label="val RMSE to return-to-go", higher=False)
CLIP = dict(metric=retrieval_acc, label="val image->caption top-1 in batches of 128")

fix("bc_steering_mse_broadcast", fixed_of(cases_shapes.bc_steering_mse_broadcast),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", fact_bc_steering, higher=False)
fix("fqe_td_target_broadcast", fixed_of(cases_shapes.fqe_td_target_broadcast), fact=fact_fqe_broadcast, **Q)
fix("rtg_discounted_sum_over_batch_axis", fixed_of(cases_shapes.rtg_discounted_sum_over_batch_axis),
    fact=fact_rtg_dim, **V)
fix("frames_hwc_reshaped_to_chw", fixed_of(cases_shapes.frames_hwc_reshaped_to_chw), acc_of(_acc_inputs2),
    "val accuracy", fact_frames)
fix("bc_transformer_batch_first_default", fixed_of(cases_shapes.bc_transformer_batch_first_default),
    acc_of(lambda m, b: (m(b[0])[:, 1:].argmax(-1), b[1][:, 1:])), "val action accuracy", fact_batch_first)

fix("fqe_bootstraps_through_terminals", fixed_of(cases_targets.fqe_bootstraps_through_terminals),
    fact=fact_terminals, **Q)
fix("rtg_discount_from_episode_start", fixed_of(cases_targets.rtg_discount_from_episode_start), fact=fact_rtg_start,
    **V)
fix("returns_leak_across_episode_boundaries", fixed_of(cases_targets.returns_leak_across_episode_boundaries),
    fact=fact_boundaries, **V)
fix("awr_advantage_sign_flipped", fixed_of(cases_targets.awr_advantage_sign_flipped),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val best-action accuracy", fact_awr_sign)
fix("clip_targets_are_class_ids", fixed_of(cases_targets.clip_targets_are_class_ids), fact=fact_clip_targets, **CLIP)

fix("fqe_optimizer_holds_target_net", fixed_of(cases_trained.fqe_optimizer_holds_target_net), fact=fact_target_opt,
    **Q)
fix("fusion_freeze_filter_freezes_text_encoder", fixed_of(cases_trained.fusion_freeze_filter_freezes_text_encoder),
    acc_of(_acc_inputs2), "val accuracy", fact_freeze)
fix("bc_head_replaced_after_optimizer", fixed_of(cases_trained.bc_head_replaced_after_optimizer),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", fact_head)
fix("fusion_projection_built_in_forward", fixed_of(cases_trained.fusion_projection_built_in_forward),
    acc_of(_acc_inputs2), "val accuracy", fact_proj)
fix("bc_log_std_not_a_parameter", fixed_of(cases_trained.bc_log_std_not_a_parameter), cases_trained.gaussian_nll,
    "val action NLL", fact_log_std, higher=False)

fix("fqe_soft_update_arguments_swapped", fixed_of(cases_mechanics.fqe_soft_update_arguments_swapped),
    fact=fact_soft_update, **Q)
fix("clip_warmup_longer_than_run", fixed_of(cases_mechanics.clip_warmup_longer_than_run), fact=fact_warmup, **CLIP)
fix("fqe_detach_on_wrong_side", fixed_of(cases_mechanics.fqe_detach_on_wrong_side), fact=fact_detach, **Q)
fix("modality_dropout_active_at_eval", fixed_of(cases_mechanics.modality_dropout_active_at_eval),
    acc_of(_acc_inputs2), "val accuracy", fact_modality)
fix("clip_accumulation_shrinks_negatives", fixed_of(cases_mechanics.clip_accumulation_shrinks_negatives),
    fact=fact_accum, **CLIP)

fix("returns_computed_after_shuffling_buffer", fixed_of(cases_data.returns_computed_after_shuffling_buffer),
    fact=fact_shuffle, **V)
fix("bc_action_chunks_normalised_per_chunk", fixed_of(cases_data.bc_action_chunks_normalised_per_chunk),
    rmse_of(lambda m, b: (m.act(b[0]), b[1])), "val RMSE in raw action units", fact_chunks, higher=False)
fix("bc_obs_action_off_by_one", fixed_of(cases_data.bc_obs_action_off_by_one),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", fact_off_by_one)
fix("clip_captions_in_different_order", fixed_of(cases_data.clip_captions_in_different_order), fact=fact_captions,
    **CLIP)
fix("fqe_timeouts_treated_as_terminals", fixed_of(cases_data.fqe_timeouts_treated_as_terminals), fact=fact_timeouts,
    **Q)

