"""The fact each broken case of set bb rests on, printed by verify.py before the case is trained (importing this
module attaches each function to FIXES[name]["fact"])."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_bb import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_bb.registry import FIXES
from benchmarks.blind_preflight_bb.synth import SR, decimate2, log_spec, tone_clips

FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        return fn
    return register


def first_batch(kw):
    return next(iter(kw["train_loader"]))


@fact("kws_frames_as_conv_channels")
def _():
    x, _y = first_batch(cases_shapes.kws_frames_as_conv_channels())
    print(f"  batch {tuple(x.shape)} = (B, frames, bands); Conv1d(in_channels=32) reads dim 1 (frames) as channels")


@fact("sed_clip_pool_over_class_axis")
def _():
    kw = cases_shapes.sed_clip_pool_over_class_axis()
    x, y = first_batch(kw)
    out = kw["model"](x)
    print(f"  frame logits {tuple(out.shape)} (B, T, C); amax(dim=-1) -> {tuple(out.amax(-1).shape)}, "
          f"labels {tuple(y.shape)}: the shapes agree, the axes do not")


@fact("nextitnet_readout_at_padding")
def _():
    x, _y = first_batch(cases_shapes.nextitnet_readout_at_padding())
    lengths = (x != 0).sum(1)
    print(f"  sessions padded to {x.shape[1]}; {(lengths <= x.shape[1] - 7).float().mean():.0%} of the batch has only "
          "padding in the receptive field (7) of position -1")


@fact("bigru_h_n_view_mixes_clips")
def _():
    h_n = torch.arange(8).float().view(2, 4, 1)   # (directions, B=4, d=1); value = direction * 4 + clip
    print(f"  h_n (2, B=4, 1), value = direction * 4 + clip; rows of h_n.view(4, -1): {h_n.view(4, -1).tolist()} "
          "(row 0 = clips 0 and 1, forward only)")


@fact("sasrec_encoder_not_batch_first")
def _():
    layer = cases_shapes.sasrec_encoder_not_batch_first()["model"].enc.layers[0]
    print(f"  TransformerEncoderLayer.self_attn.batch_first = {layer.self_attn.batch_first}; input is (B, T, d)")


@fact("gru4rec_targets_not_shifted")
def _():
    seq, target = first_batch(cases_targets.gru4rec_targets_not_shifted())
    print(f"  targets equal inputs at {(seq == target).float().mean():.0%} of positions")


@fact("sampled_softmax_positive_last_column")
def _():
    print("  logits = cat([neg (B, 20), pos (B, 1)]) -> the positive is column 20; target = zeros -> column 0")


@fact("kws_label_map_per_split")
def _():
    words = cases_targets.WORDS
    a = {w: i for i, w in enumerate(sorted(words))}
    b = {w: i for i, w in enumerate(sorted(set(words) - {"go"}))}
    print(f"  folder A: left -> {a['left']}, yes -> {a['yes']}; folder B (no 'go'): left -> {b['left']}, "
          f"yes -> {b['yes']}")


@fact("vad_frame_labels_cropped")
def _():
    kw = cases_targets.vad_frame_labels_cropped()
    x, y = first_batch(kw)
    out = kw["model"](x)
    agree = (y[:, : out.shape[1]] == y[:, ::4]).float().mean()
    print(f"  input frames {y.shape[1]}, output frames {out.shape[1]}; cropped labels agree with strided ones "
          f"on {agree:.0%} of output frames")


@fact("kws_silence_folded_into_unknown")
def _():
    kw = cases_targets.kws_silence_folded_into_unknown()
    y = kw["train_loader"].dataset.tensors[1]
    print(f"  training label counts per class {torch.bincount(y, minlength=6).tolist()} "
          f"(class 4 = _silence_)")


@fact("sasrec_model_rebuilt_after_optimizer")
def _():
    kw = cases_trained.sasrec_model_rebuilt_after_optimizer()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  model parameters held by the optimizer: {sum(id(p) in held for p in kw['model'].parameters())} of "
          f"{len(list(kw['model'].parameters()))}")


@fact("frontend_cut_by_numpy_roundtrip")
def _():
    kw = cases_trained.frontend_cut_by_numpy_roundtrip()
    x, y = first_batch(kw)
    kw["loss_fn"](kw["model"](x), y).backward()
    print(f"  frontend.weight.grad after backward: {kw['model'].frontend.weight.grad}")


@fact("probe_pretrained_not_loaded")
def _():
    model = cases_trained.ProbeNet(8)
    result = model.load_state_dict(cases_trained.pretrained_frontend_state(), strict=False)
    print(f"  load_state_dict(strict=False): unexpected {result.unexpected_keys}, "
          f"missing {result.missing_keys[:2]}...")


@fact("item_embeddings_frozen_from_pretrained")
def _():
    emb = nn.Embedding.from_pretrained(torch.eye(3))
    print(f"  nn.Embedding.from_pretrained(w).weight.requires_grad = {emb.weight.requires_grad}")


@fact("gru_outputs_detached")
def _():
    kw = cases_trained.gru_outputs_detached()
    x, y = first_batch(kw)
    kw["loss_fn"](kw["model"](x), y).backward()
    print(f"  grad of gru.weight_hh_l0 after backward: {kw['model'].gru.weight_hh_l0.grad}")


@fact("sasrec_no_causal_mask")
def _():
    seq, target = first_batch(cases_mechanics.sasrec_no_causal_mask())
    print(f"  target at position t equals input at t+1 on {(seq[:, 1:] == target[:, :-1]).float().mean():.0%} of "
          "positions, and with no mask position t attends to t+1")


@fact("sasrec_key_padding_mask_inverted")
def _():
    seq, _y = first_batch(cases_mechanics.sasrec_key_padding_mask_inverted())
    mask = seq != 0
    print(f"  src_key_padding_mask = seq != 0 is True on {mask.float().mean():.0%} of keys (the real items); "
          "True means 'ignore'")


@fact("sampled_softmax_no_logq_correction")
def _():
    q = cases_mechanics.zipf_q(200)
    print(f"  negatives drawn with Q(item): most popular {q[1]:.3f}, rarest {q[200]:.5f}; log Q not subtracted")


@fact("cosine_logits_no_temperature")
def _():
    logits = torch.full((1, 301), -1.0)
    logits[0, 0] = 1.0
    print(f"  best case, cosine +1 vs -1 for 300 others: p(true) = {F.softmax(logits, -1)[0, 0]:.3f}")


@fact("kws_exponential_lr_per_batch")
def _():
    kw = cases_mechanics.kws_exponential_lr_per_batch()
    for _ in range(60):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print(f"  LR after 60 of 300 steps: {kw['scheduler'].get_last_lr()[0]:.2e} (start 1e-3)")


@fact("alarm_per_clip_normalisation")
def _():
    x, y = cases_data.level_clips(600, 41)
    xn = (x - x.mean(dim=(1, 2), keepdim=True)) / x.std(dim=(1, 2), keepdim=True)
    print(f"  clip means per class before: {[round(x[y == k].mean().item(), 2) for k in range(3)]}, after per-clip "
          f"normalisation: {[round(xn[y == k].mean().item(), 2) for k in range(3)]}")


@fact("kws_train_audio_not_resampled")
def _():
    wav16, _ = tone_clips(1, 1, 0, length=2 * 3968, src_sr=2 * SR)
    raw, res = log_spec(wav16[:, :3968]).mean(-1).argmax(1), log_spec(decimate2(wav16)).mean(-1).argmax(1)
    print(f"  a 500 Hz tone recorded at 16 kHz: loudest band {raw.item()} when read as 8 kHz, {res.item()} after "
          "resampling")


@fact("kws_crop_first_second")
def _():
    wav, _ = cases_data.long_clips(400, 44)
    first = wav[:, :3968].pow(2).mean(1)
    print(f"  clips whose first second holds the keyword (energy above noise): {(first > 0.15).float().mean():.0%}")


@fact("item_zero_is_padding_id")
def _():
    seq, target = cases_data.popularity_ranked_sessions(2000, 40, 45)
    print(f"  id 0 (most popular) is {(target == 0).float().mean():.0%} of targets (ignored) and {(seq[:, -2:] == 0).any(1).float().mean():.0%} of "
          "sessions have it among the last two items (zero embedding)")


@fact("sessions_sorted_by_item_not_time")
def _():
    kw = cases_data.sessions_sorted_by_item_not_time()
    seq, _y = first_batch(kw)
    print(f"  training sessions sorted by id: {bool((seq[:, 1:] >= seq[:, :-1]).all())}; first one {seq[0].tolist()}")


for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
