"""The fact each broken case of set ae rests on, printed by ``verify.py`` before the case is trained next to its fix.
Importing this module attaches one function per case to ``FIXES`` (key ``fact``)."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_ae.registry import FIXES, load_all

load_all()  # registers the cases (and their fixes) in family order before the facts attach

from benchmarks.blind_preflight_ae import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained  # noqa: E402


def fact(name):
    def attach(fn):
        FIXES[name]["fact"] = fn
        return fn
    return attach


@fact("ae_vibration_target_keeps_channel_dim")
def _():
    out, tgt = torch.zeros(50, 64), torch.zeros(50, 1, 64)
    print(f"  fact: output {tuple(out.shape)} - target {tuple(tgt.shape)} broadcasts to {tuple((out - tgt).shape)}")


@fact("mlm_transformer_layer_seq_first")
def _():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0).eval()
    x = torch.randn(4, 6, 8)
    y1 = layer(x)
    x2 = x.clone()
    x2[1] += 1.0                                      # change another sequence of the batch
    print(f"  fact: batch_first={layer.self_attn.batch_first}; changing sample 1 changes sample 0's output: "
          f"{not torch.allclose(layer(x2)[0], y1[0])}")


@fact("seq2seq_logits_view_not_permute")
def _():
    logits = torch.arange(3 * 4).reshape(1, 3, 4)   # (B=1, T=3, V=4)
    print(f"  fact: view(1, 4, 3)[0, :, 0] = {logits.view(1, 4, 3)[0, :, 0].tolist()} "
          f"vs permute(0, 2, 1)[0, :, 0] = {logits.permute(0, 2, 1)[0, :, 0].tolist()} (position 0's scores)")


@fact("simclr_views_split_with_view")
def _():
    ids = torch.cat([torch.arange(4), torch.arange(4) + 100])[:, None]   # view 1: 0..3, view 2: 100..103
    a, b = ids.view(4, 2, 1).unbind(1)
    print(f"  fact: pairs after view(B, 2, D): {list(zip(a.flatten().tolist(), b.flatten().tolist()))}")


@fact("session_lm_pad_sequence_time_major")
def _():
    xs, _ = cases_shapes.session_collate(batch_first=False)([torch.arange(6), torch.arange(9), torch.arange(7)])
    print(f"  fact: 3 sessions of length 5..8 collate to {tuple(xs.shape)} (T, B) for a batch_first GRU")


@fact("dae_reconstructs_the_noisy_input")
def _():
    x = torch.randn(256, 64)
    noisy = x + 0.6 * torch.randn_like(x)
    print(f"  fact: the identity map has loss 0 against the noisy target but RMSE "
          f"{(noisy - x).pow(2).mean().sqrt():.2f} to the clean trace")


@fact("mlm_labels_cloned_after_masking")
def _():
    ex = cases_targets.mlm_examples(1, 21, labels_after_masking=True)[0]
    keep = ex["labels"] != -100
    print(f"  fact: labels at masked positions: {ex['labels'][keep].tolist()} ([MASK] id = {cases_targets.MASK})")


@fact("siamese_pair_label_convention_inverted")
def _():
    d = torch.tensor([0.1])
    loss = cases_targets.contrastive_loss(label_one_is_same=False)
    m = nn.Identity()
    same = loss(m, (d[None], torch.zeros(1, 1), torch.ones(1, dtype=torch.long))).item()
    print(f"  fact: a 'same' pair (label 1) at distance 0.1 costs {same:.2f} (pushed out to the margin)")


@fact("t5_decoder_inputs_are_the_labels")
def _():
    ex = cases_targets.cipher_examples(1, 41, unshifted=True)[0]
    print(f"  fact: decoder_input_ids {ex['decoder_input_ids'].tolist()} == labels {ex['labels'].tolist()}: "
          f"position t is fed the token it must predict")


@fact("infonce_view_compared_with_itself")
def _():
    z = F.normalize(torch.randn(8, 16), dim=1)
    print(f"  fact: with z1 @ z1.T the diagonal is always the row maximum: "
          f"{bool(((z @ z.T).argmax(1) == torch.arange(8)).all())} for random embeddings")


@fact("ae_output_layer_replaced_after_optimizer")
def _():
    kw = cases_trained.spectrum_ae()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  fact: new output layer weight in the optimizer: {id(kw['model'][-1].weight) in in_opt}")


@fact("distill_kd_term_uses_teacher_twice")
def _():
    t = torch.randn(4, 5)
    kd = F.kl_div(F.log_softmax(t / 2, 1), F.softmax(t / 2, 1), reduction="batchmean")
    print(f"  fact: KL(teacher || teacher) = {kd.item():.1e}, requires_grad = {kd.requires_grad}")


@fact("denoiser_optimizer_built_on_ema_copy")
def _():
    kw = cases_trained.ema_denoiser()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  fact: model.net parameters in the optimizer: "
          f"{sum(id(p) in in_opt for p in kw['model'].net.parameters())}; EMA requires_grad: "
          f"{next(kw['model'].ema.parameters()).requires_grad}")


@fact("seq2seq_encoder_left_out_of_optimizer")
def _():
    kw = cases_trained.seq2seq_decoder_only_opt()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    enc = list(kw["model"].encoder.parameters()) + list(kw["model"].emb_src.parameters())
    print(f"  fact: encoder parameters in the optimizer: {sum(id(p) in in_opt for p in enc)} of {len(enc)}")


@fact("classifier_head_created_in_forward")
def _():
    m = cases_trained.ReconAndClassify(24, 4, head_in_init=False)
    x = torch.randn(3, 24)
    print(f"  fact: parameters {sum(p.numel() for p in m.parameters())} (no head); two calls give the same logits: "
          f"{torch.allclose(m(x)[1], m(x)[1])}")


@fact("vae_kl_summed_reconstruction_averaged")
def _():
    x = torch.randn(64, 64)
    rec = F.mse_loss(torch.zeros_like(x), x).item()
    kl = -0.5 * torch.sum(1 + torch.zeros(64, 8) - torch.ones(64, 8) - 1).item()
    print(f"  fact: reconstruction term of the mean output {rec:.2f} vs KL of a posterior with mu=1 {kl:.0f}")


@fact("ae_functional_dropout_ignores_eval")
def _():
    m = cases_mechanics.DropAE().eval()
    x = torch.randn(2, 64)
    print(f"  fact: in eval mode two forward passes agree: {torch.allclose(m(x), m(x))}")


@fact("seq2seq_decoder_starts_from_zero_state")
def _():
    m = cases_mechanics.CipherSeq2Seq(16).eval()
    dec = torch.ones(2, 3, dtype=torch.long)
    a = m(torch.full((2, 6), 3), dec)
    b = m(torch.full((2, 6), 9), dec)
    print(f"  fact: two different sources give identical decoder outputs: {torch.allclose(a, b)}")


@fact("transformer_decoder_without_causal_mask")
def _():
    m = cases_mechanics.TinySeq2SeqTransformer(8, 8).eval()
    src, dec = torch.randint(2, 8, (1, 8)), torch.randint(2, 8, (1, 8))
    dec2 = dec.clone()
    dec2[0, -1] = (dec2[0, -1] - 1) % 6 + 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        changed = not torch.allclose(m(src, dec)[0, 0], m(src, dec2)[0, 0])
    print(f"  fact: position 0's logits change when the LAST decoder input changes: {changed}")


@fact("kd_kl_div_given_student_probabilities")
def _():
    t = torch.tensor([[0.6, 0.3, 0.1]])
    soft, onehot = torch.tensor([[0.6, 0.3, 0.1]]), torch.tensor([[0.98, 0.01, 0.01]])
    print(f"  fact: kl_div(probs, teacher) prefers the one-hot student: matching {F.kl_div(soft, t, reduction='sum'):.3f}"
          f" vs one-hot {F.kl_div(onehot, t, reduction='sum'):.3f}")


@fact("denoiser_flips_input_and_target_independently")
def _():
    import random
    random.seed(0)
    ds = cases_data.FlipPairs(cases_data.tiles(200, 1), shared_flip=False)
    pairs = 0
    for i in range(200):
        noisy, clean = ds[i]
        pairs += (noisy - clean).abs().mean() > 0.35
    print(f"  fact: {int(pairs)} of 200 training pairs are mirror images of each other (input and target flipped differently)")


@fact("distill_teacher_logits_precomputed_shuffled")
def _():
    teacher = cases_data.audio_teacher()
    x = torch.randn(500, 24)
    stored = cases_data.precompute_teacher(teacher, x, shuffle=True)
    with torch.no_grad():
        agree = (stored.argmax(1) == teacher(x).argmax(1)).float().mean()
    print(f"  fact: stored soft target's class matches the row's own teacher class for {agree:.0%} of rows")


@fact("triplet_positive_drawn_from_any_class")
def _():
    import random
    random.seed(0)
    x, y = cases_data.gait_data(400, 1)
    ds = cases_data.GaitTriplets(x, y, positive_from_anchor_class=False)
    lookup = {tuple(r.tolist()): int(c) for r, c in zip(x, y)}
    same = sum(lookup[tuple(ds[i][1].tolist())] == int(y[i]) for i in range(400))
    print(f"  fact: {same} of 400 positives share the anchor's identity")


@fact("seq2seq_sources_sorted_targets_not")
def _():
    src, _, tgt = cases_data.cipher_pairs(200, 1, sort_sources_only=True)
    match = ((src != 0).sum(1) == (tgt != -100).sum(1)).float().mean()
    print(f"  fact: source and target lengths agree for {match:.0%} of pairs after sorting sources only")


@fact("sprite_ae_pixels_divided_by_255_twice")
def _():
    imgs = (cases_data.tiles(50, 1) * 255).round().to(torch.uint8)
    x, _ = cases_data.SpriteTiles(imgs, divide_twice=True)[0]
    print(f"  fact: training input max {x.max():.5f} vs validation max {(imgs[0].float() / 255).max():.2f}")

