"""The fact each broken case of set p rests on, printed by verify.py before training (no preflight): shapes, dtypes,
learning rates, gradients, label values or codes, measured on the case as built."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_p import cases_data as D
from benchmarks.blind_preflight_p import cases_mechanics as M
from benchmarks.blind_preflight_p import cases_shapes as S
from benchmarks.blind_preflight_p import cases_targets as T
from benchmarks.blind_preflight_p import cases_trained as W
from benchmarks.blind_preflight_p.registry import FIXES


def say(text: str) -> None:
    print("  fact: " + text)


def first_batch(kw, key="train_loader"):
    return next(iter(kw[key]))


def _rent():
    kw = S.rent_mse_broadcast()
    x, y = first_batch(kw)
    out = kw["model"](x)
    per = torch.nn.MSELoss(reduction="none")(out, y)
    say(f"output {tuple(out.shape)}, target {tuple(y.shape)}, per-element MSE {tuple(per.shape)}")


def _peptide():
    kw = S.peptide_transformer_seq_first()
    m = kw["model"]
    x, _ = first_batch(kw)
    h = m.encoder(m.emb(x) + m.pos[:, : x.size(1)])
    say(f"batch_first={m.encoder.layers[0].self_attn.batch_first}, input {tuple(x.shape)}; std of the [CLS] output "
        f"across the batch {h[:, 0].std(0).mean().item():.2e}")


def _tickets():
    kw = S.ticket_gru_last_pad_step()
    x, _ = first_batch(kw)
    lengths = (x != 0).sum(1).float()
    say(f"out[:, -1] is a pad step for {(x[:, -1] == 0).float().mean().item():.0%} of tickets; mean pad steps after "
        f"the last token {(S.MAX_LEN - lengths).mean().item():.1f}")


def _keywords():
    feats = torch.arange(S.N_FRAMES * S.N_MELS).view(1, S.N_FRAMES, S.N_MELS)
    viewed, swapped = feats.view(1, S.N_MELS, -1), feats.transpose(1, 2)
    say(f"view == transpose: {torch.equal(viewed, swapped)}; channel 0 of the view holds (frame, mel) "
        f"{[(int(v) // S.N_MELS, int(v) % S.N_MELS) for v in viewed[0, 0, 24:30]]}")


def _charlm():
    kw = S.charlm_targets_seq_first()
    x, y = first_batch(kw)
    true_next = torch.cat([x[:, 1:], y.t()[:, -1:]], 1).reshape(-1)
    say(f"inputs {tuple(x.shape)}, targets {tuple(y.shape)}; flattened pairs whose target is the right next "
        f"character: {(y.reshape(-1) == true_next).float().mean().item():.1%} (chance {1 / S.LM_VOCAB:.1%})")


def _cosine():
    kw = T.dupquestions_cosine_labels_01()
    q1, q2, label = first_batch(kw)
    per = torch.nn.CosineEmbeddingLoss(reduction="none")(kw["model"](q1), kw["model"](q2), label)
    say(f"label values {sorted(set(label.tolist()))}; loss of pairs labelled 0: max {per[label == 0].max().item():.1f}")


def _crack():
    kw = T.crack_mask_normalized()
    _, mask = first_batch(kw)
    say(f"BCE target values {sorted(set(mask.unique().tolist()))}")


def _ctr():
    kw = T.ctr_relu_before_bce()
    ids, ctx, y = first_batch(kw)
    p = torch.sigmoid(kw["model"](ids, ctx))
    say(f"min predicted click probability {p.min().item():.3f}; click rate {y.mean().item():.2f}")


def _tags():
    kw = T.music_multilabel_crossentropy()
    x, y = first_batch(kw)
    p = kw["model"](x).softmax(-1)
    say(f"tags per clip {y.sum(1).mean().item():.2f}; softmax rows sum to {p.sum(1).mean().item():.3f}, so at most "
        f"one tag can exceed 0.5")


def _window():
    kw = T.load_window_target_not_shifted()
    x, y = first_batch(kw)
    say(f"max |target - last input value| = {(y[:, 0] - x[:, -1]).abs().max().item():.3g}")


def _battery():
    kw = W.battery_numpy_detach_in_forward()
    x, y = first_batch(kw)
    F.mse_loss(kw["model"](x), y).backward()
    say(f"encoder grads after backward: {[p.grad is None for p in kw['model'].encoder.parameters()]} (None: True)")


def _movies():
    kw = W.movies_from_pretrained_frozen()
    say(f"movie embedding requires_grad={kw['model'].movie.weight.requires_grad}")


def _loans():
    kw = W.loans_tensor_not_parameter()
    names = [n for n, _ in kw["model"].named_parameters()]
    say(f"registered parameters {names}; ScratchLayer.W is a Parameter: "
        f"{isinstance(kw['model'].hidden.W, torch.nn.Parameter)}")


def _speakers():
    kw = W.speakers_layer_built_in_forward()
    x, _ = first_batch(kw)
    m = kw["model"].eval()
    with torch.no_grad():
        same = torch.equal(m(x[:4]).argmax(-1), m(x[:4]).argmax(-1)) and torch.allclose(m(x[:4]), m(x[:4]))
    say(f"two forward passes on the same input agree: {same}; head in named_parameters: "
        f"{any(n.startswith('head') for n, _ in m.named_parameters())}")


def _landuse():
    kw = W.landuse_optimizer_before_head_swap()
    in_opt = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    trainable = [n for n, p in kw["model"].named_parameters() if p.requires_grad]
    say(f"trainable model parameters {trainable}; of them in the optimizer: "
        f"{[n for n, p in kw['model'].named_parameters() if p.requires_grad and id(p) in in_opt]}")


def _lr_trace(kw, steps):
    opt, sched, out = kw["optimizer"], kw["scheduler"], []
    for i in range(max(steps) + 1):
        if i in steps:
            out.append(f"step {i}: {opt.param_groups[0]['lr']:.2e}")
        opt.step()
        sched.step()
    return ", ".join(out)


def _reviews():
    say("lr " + _lr_trace(M.reviews_schedule_total_is_epochs(), [0, 1, 5, 10, 100]))


def _ecg():
    say("lr " + _lr_trace(M.ecg_lambdalr_returns_lr(), [0, 10, 60, 200]))


def _demand():
    kw = M.demand_optimizer_state_restores_lr()
    say(f"optimizer built with lr=1e-3; after load_state_dict: lr={kw['optimizer'].param_groups[0]['lr']:.1e}")


def _bf16():
    moved = {}
    for fixed in (False, True):
        kw = M.activity_bf16_weights(fixed=fixed)
        m, opt = kw["model"], kw["optimizer"]
        before = [p.detach().float().clone() for p in m.parameters()]
        it = iter(kw["train_loader"])
        for _ in range(20):
            x, y = next(it)
            opt.zero_grad()
            F.cross_entropy(m(x).float(), y).backward()
            opt.step()
        after = [p.detach().float() for p in m.parameters()]
        moved[fixed] = (sum((a != b).sum().item() for a, b in zip(after, before))
                        / sum(b.numel() for b in before))
    say(f"weight dtype bfloat16; share of weights changed after 20 Adam steps (lr 1e-4): bf16 {moved[False]:.0%}, "
        f"fp32 {moved[True]:.0%}")


def _promoter():
    kw = M.promoter_checkpoint_reentrant()
    x, y = first_batch(kw)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        F.cross_entropy(kw["model"](x), y).backward()
    say(f"conv block grads None: {[p.grad is None for p in kw['model'].blocks.parameters()]}; head grad None: "
        f"{kw['model'].head.weight.grad is None}")


def _ball():
    kw = D.ball_flip_without_box()
    x, c = first_batch(kw)
    col = x[:, 0].amax(1).argmax(-1).float()          # a column of the ball in the image
    mirrored = ((col - c[:, 0] * D.IMG).abs() > 3).float().mean()
    say(f"training samples whose target x is not where the ball is: {mirrored.item():.0%}")


def _claims():
    _, uniq = D._encode(D._claims_frame(3000, 25), None)
    _, uniq_val = D._encode(D._claims_frame(600, 26), None)
    say(f"vehicle categories by code 0-3: train {[str(v) for v in uniq['vehicle'][:4]]}, validation "
        f"{[str(v) for v in uniq_val['vehicle'][:4]]}")


def _gcn():
    kw = D.citations_gcn_no_self_loops()
    _, a_hat, _, _ = next(iter(kw["train_loader"]))
    say(f"diagonal of the normalised adjacency: max {a_hat.diagonal().max().item():.2f}")


def _fruit():
    kw = D.fruit_bgr_train_rgb_val()
    xt, yt = kw["train_loader"].dataset.tensors
    xv, yv = kw["val_loader"].dataset.tensors
    say(f"mean (ch0, ch1, ch2) of the red class: train {[round(v, 2) for v in xt[yt == 0].mean((0, 2, 3)).tolist()]},"
        f" validation {[round(v, 2) for v in xv[yv == 0].mean((0, 2, 3)).tolist()]}")


def _landcover():
    kw = D.landcover_sorted_split()
    yt, yv = kw["train_loader"].dataset.tensors[1], kw["val_loader"].dataset.tensors[1]
    say(f"class counts train {torch.bincount(yt, minlength=5).tolist()}, validation "
        f"{torch.bincount(yv, minlength=5).tolist()}")


FACTS = {
    "shapes_rent_mse_broadcast": _rent, "shapes_peptide_transformer_seq_first": _peptide,
    "shapes_ticket_gru_last_pad_step": _tickets, "shapes_keyword_view_not_transpose": _keywords,
    "shapes_charlm_targets_seq_first": _charlm,
    "targets_dupquestions_cosine_labels_01": _cosine, "targets_crack_mask_normalized": _crack,
    "targets_ctr_relu_before_bce": _ctr, "targets_music_multilabel_crossentropy": _tags,
    "targets_load_window_target_not_shifted": _window,
    "trained_battery_numpy_detach_in_forward": _battery, "trained_movies_from_pretrained_frozen": _movies,
    "trained_loans_tensor_not_parameter": _loans, "trained_speakers_layer_built_in_forward": _speakers,
    "trained_landuse_optimizer_before_head_swap": _landuse,
    "mechanics_reviews_schedule_total_is_epochs": _reviews, "mechanics_ecg_lambdalr_returns_lr": _ecg,
    "mechanics_demand_optimizer_state_restores_lr": _demand, "mechanics_activity_bf16_weights": _bf16,
    "mechanics_promoter_checkpoint_reentrant": _promoter,
    "data_ball_flip_without_box": _ball, "data_claims_factorize_separately": _claims,
    "data_citations_gcn_no_self_loops": _gcn, "data_fruit_bgr_train_rgb_val": _fruit,
    "data_landcover_sorted_split": _landcover,
}

for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
