"""Facts behind set f's broken cases, checked without the preflight: the shapes and values the loss sees, what the
data holds, what the optimizer holds, and the case trained next to its one-line fix (same data, same steps).

    .venv/bin/python -m benchmarks.blind_preflight_f.verify [NAME ...]
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_f import cases_data as D
from benchmarks.blind_preflight_f import cases_healthy as H
from benchmarks.blind_preflight_f import cases_mechanics as M
from benchmarks.blind_preflight_f import cases_shapes as S
from benchmarks.blind_preflight_f import cases_targets as T
from benchmarks.blind_preflight_f import cases_trained as W
from benchmarks.blind_preflight_f.registry import load_all, loader
from benchmarks.blind_preflight_f.sanity import loss_of, run_case

CASES = load_all()


def train(kw, steps=200):
    class C:  # a Case-like wrapper for sanity.run_case
        build = staticmethod(lambda: kw)
    losses, model = run_case(C, steps)
    return sum(losses[:3]) / 3, sum(losses[-10:]) / 10, model


def build(name):
    return CASES[name].build()


def fresh(kw, model, lr=None, opt=torch.optim.Adam):
    kw["model"] = model
    kw["optimizer"] = opt(model.parameters(), lr=lr or kw["optimizer"].param_groups[0]["lr"])
    return kw


@torch.no_grad()
def accuracy(model, val_loader, fwd=None):
    """fwd(model, batch) -> (predictions, targets); default: model(batch[0]).argmax(-1) vs batch[-1]."""
    model.eval()
    right = n = 0
    for batch in val_loader:
        pred, y = fwd(model, batch) if fwd else (model(batch[0]).argmax(-1), batch[-1])
        keep = y != -100
        right += (pred[keep] == y[keep]).sum().item()
        n += keep.sum().item()
    model.train()
    return right / n


def val_acc(model, kw):
    return accuracy(model, kw["val_loader"])


@torch.no_grad()
def val_loss(model, kw):
    model.eval()
    losses = [loss_of(kw.get("loss_fn"), model, b).item() for b in kw["val_loader"]]
    model.train()
    return sum(losses) / len(losses)


def compare(name, fixed, steps=300, metric=None, label="val acc"):
    broken = build(name)
    b0, b1, bm = train(broken, steps)
    f0, f1, fm = train(fixed, steps)
    line = f"  broken loss {b0:.4g} -> {b1:.4g}; fixed loss {f0:.4g} -> {f1:.4g} ({steps} steps)"
    if metric:
        line += f" | {label}: broken {metric(bm, broken):.3f}, fixed {metric(fm, fixed):.3f}"
    print(line, flush=True)
    return bm, fm


def torch0(seed=0):
    torch.manual_seed(seed)


# --------------------------------------------------------------------------- shapes


def v_heads():
    name = "char_lm_attention_heads_not_transposed"
    kw = build(name)
    m = kw["model"].eval()
    (ids,) = next(iter(kw["train_loader"]))
    ids2 = ids.clone()
    ids2[:, :5] = (ids2[:, :5] + 7) % 29 + 3
    with torch.no_grad():
        moved = (m(ids)[:, 10] - m(ids2)[:, 10]).abs().max().item()
    print(f"  logits at position 10 change when tokens 0-4 change: max |diff| = {moved:.2e} (no context)")
    torch0()
    fixed = fresh(build(name), S.TinyGPT(attention=H.HeadsAttention), opt=torch.optim.AdamW)
    compare(name, fixed, 300, val_loss, "val next-token CE")


def v_bct():
    name = "pos_tagger_logits_reshaped_to_bct"
    kw = build(name)
    ids, tags = next(iter(kw["train_loader"]))
    logits = kw["model"](ids)
    r = logits.reshape(tags.size(0), -1, tags.size(1))
    print("  scores the loss uses for token (0, 3):", [round(v, 3) for v in r[0, :, 3].tolist()],
          "| the model's own logits there:", [round(v, 3) for v in logits[0, 3].tolist()])
    fixed = build(name)
    fixed["loss_fn"] = lambda m, b: F.cross_entropy(m(b[0]).transpose(1, 2), b[1])

    def tag_acc(model, k):
        if k["loss_fn"] is S.tagger_loss:      # predictions in the layout the loss trained
            fwd = lambda m, b: (m(b[0]).reshape(b[1].size(0), -1, b[1].size(1)).argmax(1), b[1])  # noqa: E731
        else:
            fwd = lambda m, b: (m(b[0]).argmax(-1), b[1])  # noqa: E731
        return accuracy(model, k["val_loader"], fwd)
    compare(name, fixed, 300, tag_acc, "val tag accuracy")


def v_kpm():
    name = "ticket_transformer_attention_mask_as_key_padding_mask"
    ids, att, y = next(iter(build(name)["train_loader"]))
    print(f"  keys hidden by src_key_padding_mask=attention_mask.bool(): real tokens {att.bool().sum().item()}, "
          f"padding {(~att.bool()).sum().item()} (the padding is what stays visible)")
    torch0()
    fixed = fresh(build(name), H.ClsTransformerMasked(), opt=torch.optim.AdamW)
    fwd = lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])  # noqa: E731
    compare(name, fixed, 300, lambda m, k: accuracy(m, k["val_loader"], fwd))


def v_view():
    name = "keyword_conv1d_frames_viewed_as_channels_first"
    x, _ = next(iter(build(name)["train_loader"]))
    print("  frames.view(B, F, T) equals frames.transpose(1, 2):",
          torch.equal(x.view(x.size(0), x.size(2), x.size(1)), x.transpose(1, 2)))
    torch0()
    compare(name, fresh(build(name), H.TransposedFrameConvNet()), 300, val_acc)


def v_vae():
    name = "sensor_vae_kl_summed_over_batch_axis"
    kw = build(name)
    (x,) = next(iter(kw["train_loader"]))
    _, mu, logvar = kw["model"](x)
    terms = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp())
    print(f"  KL as written {terms.sum(0).mean().item():.3f} vs per-sample KL {terms.sum(1).mean().item():.3f} "
          f"(ratio {terms.sum(0).mean().item() / terms.sum(1).mean().item():.1f} = batch {x.size(0)} / latent 4)")

    def fixed_loss(model, batch):
        xb = batch[0]
        recon, mu, logvar = model(xb)
        rec = F.mse_loss(recon, xb, reduction="none").sum(dim=1).mean()
        return rec + (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp())).sum(dim=1).mean()
    fixed = build(name)
    fixed["loss_fn"] = fixed_loss

    def recon_mse(model, k):
        (xv,) = k["val_loader"].dataset.tensors
        with torch.no_grad():
            mu, _ = model.enc(xv).chunk(2, dim=-1)
            return F.mse_loss(model.dec(mu), xv).item()
    print(f"  (predicting the mean vector: MSE {build(name)['val_loader'].dataset.tensors[0].var(0).mean().item():.3f})")
    compare(name, fixed, 400, recon_mse, "val reconstruction MSE")


def v_pe():
    name = "event_order_transformer_positional_encoding_on_batch_axis"
    kw = build(name)
    pe = kw["model"].pos
    z = torch.zeros(4, 16, 32)
    out = pe(z)
    print(f"  encoding added: same for all 16 positions of a sample: {torch.equal(out[0, 0], out[0, 15])}; "
          f"differs between samples 0 and 1: {not torch.equal(out[0, 0], out[1, 0])}")
    torch0()
    compare(name, fresh(build(name), S.OrderTransformer(positional=H.BatchFirstPositionalEncoding)), 300, val_acc)


def pair_auc(dist_fn, model, kw):
    a, b, same = kw["val_loader"].dataset.tensors
    with torch.no_grad():
        d = dist_fn(model, a, b)
    pos, neg = d[same == 1], d[same == 0]
    return (pos[:, None] < neg[None, :]).float().mean().item()


def v_siamese():
    name = "signature_siamese_distance_summed_over_batch"
    kw = build(name)
    a, b, same = next(iter(kw["train_loader"]))
    print("  shape of the 'pair distance':", tuple((kw["model"](a) - kw["model"](b)).pow(2).sum().sqrt().shape),
          "against labels", tuple(same.shape))
    fixed = build(name)
    fixed["loss_fn"] = H.per_pair_contrastive
    dist = lambda m, a, b: (m(a) - m(b)).pow(2).sum(1)  # noqa: E731
    compare(name, fixed, 300, lambda m, k: pair_auc(dist, m, k), "pair AUC (same-writer pairs closer)")


# --------------------------------------------------------------------------- targets


class CausalForecaster(nn.Module):
    def __init__(self, c=32, k=5):
        super().__init__()
        self.k = k
        self.c1, self.c2, self.c3 = nn.Conv1d(1, c, k), nn.Conv1d(c, c, k), nn.Conv1d(c, 1, 1)

    def forward(self, x):
        h = F.relu(self.c1(F.pad(x.unsqueeze(1), (self.k - 1, 0))))
        h = F.relu(self.c2(F.pad(h, (self.k - 1, 0))))
        return self.c3(h).squeeze(1)


def v_forecast():
    name = "load_forecaster_same_padded_conv_sees_next_value"
    kw = build(name)
    m = kw["model"]
    (x,) = next(iter(kw["train_loader"]))
    inp = x[:, :-1].clone()
    inp2 = inp.clone()
    inp2[:, 31] += 1.0
    with torch.no_grad():
        print(f"  output at t=30 moves when only input t+1=31 changes: {(m(inp)[:, 30] - m(inp2)[:, 30]).abs().mean():.3f}")
    print("  noise floor of a next-step forecast: the noise variance 0.09")
    torch0()
    fixed = fresh(build(name), CausalForecaster())

    def forecast(model, k):      # forecast value 40 from values 0..39 only, at every position as in deployment
        (xv,) = k["val_loader"].dataset.tensors
        with torch.no_grad():
            return F.mse_loss(model(xv[:, :40])[:, -1], xv[:, 40]).item()
    compare(name, fixed, 300, forecast, "val MSE forecasting x[40] from x[:40]")


def v_subword():
    name = "ner_word_tags_not_aligned_to_subword_pieces"
    ds = build(name)["train_loader"].dataset
    right = total = 0
    for i in range(200):
        words = ds.sentences[i]
        owner = [ds.tags[w] for w in words for _ in ds.pieces[w]]
        _, labels = ds[i]
        for j, lab in enumerate(labels.tolist()):
            if lab != -100:
                right += lab == owner[j]
                total += 1
    print(f"  labelled pieces carrying the tag of the word they belong to: {right / total:.2f}")

    class Aligned(T.WordTaggedSentences):
        def __getitem__(self, i):
            words = self.sentences[i]
            ids, labels = [], []
            for w in words:
                ids += self.pieces[w]
                labels += [self.tags[w]] + [-100] * (len(self.pieces[w]) - 1)
            return torch.tensor(ids), torch.tensor(labels)
    fixed = build(name)
    fixed["train_loader"] = loader(Aligned(1600, s=12), 32, collate_fn=T.pad_pairs)
    true_val = loader(Aligned(400, s=13), 100, shuffle=False, collate_fn=T.pad_pairs)
    fwd = lambda m, b: (m(b[0]).argmax(-1), b[1])  # noqa: E731
    compare(name, fixed, 300, lambda m, k: accuracy(m, true_val, fwd), "word tag accuracy (first pieces)")


def v_tags0():
    name = "photo_tag_lists_padded_with_zero_mark_tag_0"
    kw = build(name)
    x, tags = T.photo_tag_lists(s=14)
    true = torch.stack([torch.zeros(T.N_PHOTO_TAGS).index_fill_(0, t, 1.0) for t in tags])
    batch_t = torch.cat([b[1] for b in kw["train_loader"]])
    print(f"  tag 0 positive: true rate {true[:2560, 0].mean():.2f}, in the collated targets {batch_t[:, 0].mean():.2f}")

    def fixed_collate(batch):
        return (torch.stack([b[0] for b in batch]),
                torch.stack([torch.zeros(T.N_PHOTO_TAGS).index_fill_(0, b[1], 1.0) for b in batch]))
    fixed = build(name)
    fixed["train_loader"] = loader(T.TaggedPhotos(x[:2560], tags[:2560]), 64, collate_fn=fixed_collate)

    def f1_tag0(model, _k):
        with torch.no_grad():
            p = model(x[2560:])[:, 0] > 0
        t = true[2560:, 0] > 0
        tp = (p & t).sum().item()
        return 2 * tp / max(1, p.sum().item() + t.sum().item())
    compare(name, fixed, 300, f1_tag0, "tag-0 F1 on validation")


def eos_prob(model, kw):
    model.eval()
    probs = []
    with torch.no_grad():
        for b in kw["val_loader"]:
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
            last = b["attention_mask"].sum(1) - 2           # the last content token; EOS follows it
            p = logits.softmax(-1)[torch.arange(len(last)), last, T.EOS]
            probs.append(p)
    model.train()
    return torch.cat(probs).mean().item()


def v_eos():
    name = "gpt2_pad_token_set_to_eos_then_masked"
    b = next(iter(build(name)["train_loader"]))
    print(f"  EOS tokens in input_ids {(b['input_ids'][b['attention_mask'] == 1] == T.EOS).sum().item()}, "
          f"EOS targets in labels {(b['labels'] == T.EOS).sum().item()}")
    fixed = build(name)
    ids, att = T.counting_up_sequences(s=15)
    labels = ids.masked_fill(att == 0, -100)
    fixed["train_loader"] = loader(T.DictDataset(input_ids=ids[:1200], attention_mask=att[:1200],
                                                 labels=labels[:1200]), 32)
    compare(name, fixed, 300, eos_prob, "mean P(EOS) after the last value")


def v_cosine():
    name = "duplicate_questions_cosine_embedding_loss_0_1_labels"
    kw = build(name)
    qa, qb, dup = next(iter(kw["train_loader"]))
    za, zb = kw["model"](qa), kw["model"](qb)
    per = F.cosine_embedding_loss(za, zb, dup, margin=0.2, reduction="none")
    print(f"  loss of the target-0 pairs: max {per[dup == 0].abs().max().item():.1f} (they are ignored)")
    fixed = build(name)
    fixed["loss_fn"] = lambda m, b: F.cosine_embedding_loss(m(b[0]), m(b[1]), b[2] * 2 - 1, margin=0.2)
    dist = lambda m, a, b: -F.cosine_similarity(m(a), m(b))  # noqa: E731

    def report(model, k):
        a, b, d = k["val_loader"].dataset.tensors
        with torch.no_grad():
            cos = F.cosine_similarity(model(a), model(b))
        print(f"    mean cosine: duplicates {cos[d == 1].mean():.3f}, non-duplicates {cos[d == 0].mean():.3f}")
        return pair_auc(dist, model, k)
    compare(name, fixed, 300, report, "pair AUC")


def v_target_enc():
    name = "listing_target_encoding_includes_own_label"
    cat, x, y = T.listings(s=17)
    feats = T.with_neighbourhood_rate(cat, x, y)
    print(f"  accuracy of (neighbourhood rate > 0.5) alone: {((feats[:, -1] > 0.5).long() == y).float().mean():.3f}")
    tr = torch.arange(2560)
    sums = torch.zeros(1500).index_add_(0, cat[tr], y[tr].float())
    counts = torch.zeros(1500).index_add_(0, cat[tr], torch.ones(2560))
    prior = y[tr].float().mean()
    loo = (sums[cat[tr]] - y[tr].float()) / (counts[cat[tr]] - 1)
    loo = torch.where(counts[cat[tr]] > 1, loo, prior)
    honest_val = torch.where(counts[cat[2560:]] > 0, sums[cat[2560:]] / counts[cat[2560:]].clamp(min=1), prior)
    fixed = build(name)
    fixed["train_loader"] = loader(TensorDataset(torch.cat([x[tr], loo[:, None]], 1), y[tr]), 64)
    honest = TensorDataset(torch.cat([x[2560:], honest_val[:, None]], 1), y[2560:])
    bm, fm = compare(name, fixed, 400, lambda m, k: accuracy(m, loader(honest, 110, shuffle=False)),
                     "accuracy on new listings (encoded from training rows only)")
    print(f"  the broken model's own validation split (leaky encoding) reports {val_acc(bm, build(name)):.3f}")


def v_denoise():
    name = "vibration_denoiser_trained_towards_noisy_input"
    fixed = build(name)
    fixed["loss_fn"] = lambda m, b: F.mse_loss(m(b[0]), b[1])

    def clean_mse(model, k):
        ds = k["val_loader"].dataset
        with torch.no_grad():
            return F.mse_loss(model(ds.noisy), ds.clean).item()
    ds = build(name)["val_loader"].dataset
    print(f"  MSE of the noisy input itself to the clean signal: {F.mse_loss(ds.noisy, ds.clean):.3f}")
    compare(name, fixed, 400, clean_mse, "val MSE to the clean signal")


# --------------------------------------------------------------------------- what is trained


def v_const():
    name = "churn_mlp_constant_weight_init"
    kw = build(name)
    _, _, m = train(kw, 200)
    w = m[0].weight.detach()
    print(f"  distinct rows of the first layer after 200 steps: {torch.unique(w, dim=0).shape[0]} of {w.shape[0]}")
    torch0()
    compare(name, fresh(build(name), W.churn_mlp()), 300, val_acc)


def v_lossweight():
    name = "fish_multitask_age_loss_weight_key_missing"
    kw = build(name)
    loss_of(kw["loss_fn"], kw["model"], next(iter(kw["train_loader"]))).backward()
    print("  age head gradient norm:", kw["model"].age_head.weight.grad.norm().item())
    fixed = build(name)
    fixed["loss_fn"] = lambda m, b: (F.cross_entropy(m(b[0])[0], b[1]) + 0.5 * F.mse_loss(m(b[0])[1], b[2]))

    def age_mse(model, k):
        x, _, age = k["val_loader"].dataset.tensors
        with torch.no_grad():
            return F.mse_loss(model(x)[1], age).item()
    compare(name, fixed, 300, age_mse, "val age MSE (targets have variance ~1)")


def v_strict():
    name = "linear_probe_checkpoint_keys_prefixed_strict_false"
    res = W.LinearProbe().backbone.load_state_dict(W.pretrained_checkpoint(), strict=False)
    print(f"  load_state_dict(strict=False): {len(res.missing_keys)} missing, {len(res.unexpected_keys)} unexpected keys")
    fixed = build(name)
    m = W.LinearProbe()
    m.backbone.load_state_dict({k.removeprefix("module."): v for k, v in W.pretrained_checkpoint().items()})
    m.backbone.requires_grad_(False)
    m.head.load_state_dict(fixed["model"].head.state_dict())
    fixed["model"], fixed["optimizer"] = m, torch.optim.Adam(m.head.parameters(), lr=3e-3)
    compare(name, fixed, 300, val_acc)


def v_std1():
    name = "deep_mlp_weights_initialised_std_1"
    kw = build(name)
    x, _ = next(iter(kw["train_loader"]))
    with torch.no_grad():
        print(f"  logit std at initialisation: {kw['model'](x).std().item():.3g}")
    torch0()
    compare(name, fresh(build(name), W.deep_mlp()), 300, val_acc)


def v_sqrt():
    name = "face_batch_hard_triplet_sqrt_of_zero_distance"
    kw = build(name)
    loss = W.batch_hard_triplet(kw["model"], next(iter(kw["train_loader"])))
    loss.backward()
    print(f"  loss {loss.item():.3f} (finite); gradient entries that are NaN: "
          f"{sum(torch.isnan(p.grad).sum().item() for p in kw['model'].parameters())} of "
          f"{sum(p.numel() for p in kw['model'].parameters())}")

    def fixed_loss(model, batch, margin=0.5):
        x, y = batch
        z = model(x)
        dist = (z.unsqueeze(1) - z.unsqueeze(0)).pow(2).sum(-1).clamp(min=1e-12).sqrt()
        same = y.unsqueeze(0) == y.unsqueeze(1)
        eye = torch.eye(len(y), dtype=torch.bool)
        return F.relu((dist * (same & ~eye)).max(1).values - (dist + 1e6 * same).min(1).values + margin).mean()
    fixed = build(name)
    fixed["loss_fn"] = fixed_loss

    def recall1(model, k):
        xv, yv = k["val_loader"].dataset.tensors
        with torch.no_grad():
            z = model(xv)
        if not torch.isfinite(z).all():
            return float("nan")
        d = torch.cdist(z, z) + torch.eye(len(yv)) * 1e9
        return (yv[d.argmin(1)] == yv).float().mean().item()
    compare(name, fixed, 300, recall1, "val recall@1")


def v_statedict():
    name = "cnn_param_groups_built_from_state_dict"
    kw = build(name)
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print(f"  model parameters held by the optimizer: {sum(id(p) in held for p in kw['model'].parameters())} of "
          f"{len(list(kw['model'].parameters()))}")
    fixed = build(name)
    m = fixed["model"]
    fixed["optimizer"] = torch.optim.AdamW(
        [{"params": [p for n, p in m.named_parameters() if n.endswith("weight")], "weight_decay": 0.01},
         {"params": [p for n, p in m.named_parameters() if n.endswith("bias")], "weight_decay": 0.0}], lr=2e-3)
    compare(name, fixed, 300, val_acc)


def v_detach():
    name = "session_grucell_loop_detaches_hidden_every_step"
    kw = build(name)
    ids, y = next(iter(kw["train_loader"]))
    m = kw["model"]
    e = m.embed(ids).detach().requires_grad_()
    h = torch.zeros(ids.size(0), 32)
    for t in range(ids.size(1)):
        h = m.cell(e[:, t], h.detach())
    F.cross_entropy(m.head(h), y).backward()
    print(f"  gradient reaching the first step's input: {e.grad[:, 0].norm().item():.3g}, the last step's: "
          f"{e.grad[:, -1].norm().item():.3g}")
    torch0()
    fixed = build(name)
    full = H.StepwiseGRUFull()
    full.load_state_dict(fixed["model"].state_dict())
    compare(name, fresh(fixed, full), 300, val_acc)


# --------------------------------------------------------------------------- mechanics


def v_scale():
    name = "sgd_static_loss_scale_never_unscaled"
    fixed = build(name)
    fixed["loss_fn"] = nn.CrossEntropyLoss()
    compare(name, fixed, 300, val_acc)


def v_dp():
    name = "dp_gradient_noise_not_divided_by_batch_size"
    kw = build(name)
    x, y = next(iter(kw["train_loader"]))
    F.cross_entropy(kw["model"](x), y).backward()
    g = torch.cat([p.grad.flatten() for p in kw["model"].parameters()])
    print(f"  gradient norm {g.norm():.3f}; norm of the added noise ~{(g.numel() ** 0.5) * 1.0:.1f} "
          f"(divided by the batch: ~{(g.numel() ** 0.5) / 64:.2f})")
    fixed = build(name)
    fixed["optimizer"]._optimizer_step_pre_hooks.clear()

    def dp_noise(opt, args, kwargs):
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.add_(torch.randn_like(p.grad) * M.NOISE_MULTIPLIER * M.MAX_GRAD_NORM / 64)
    fixed["optimizer"].register_step_pre_hook(dp_noise)
    compare(name, fixed, 300, val_acc)


def v_range():
    name = "lr_range_test_scheduler_left_in_training"
    kw = build(name)
    lrs = []
    for i in range(600):
        kw["optimizer"].step()
        kw["scheduler"].step()
        if i in (59, 299, 599):
            lrs.append(kw["optimizer"].param_groups[0]["lr"])
    print("  lr after 60 / 300 / 600 steps:", [f"{v:.1e}" for v in lrs])
    fixed = build(name)
    fixed["optimizer"] = torch.optim.SGD(fixed["model"].parameters(), lr=0.05, momentum=0.9)
    fixed["scheduler"] = None
    compare(name, fixed, 600, val_acc)


def v_annealed():
    name = "finetune_restores_optimizer_state_with_annealed_lr"
    kw = build(name)
    print("  lr after optimizer.load_state_dict:", kw["optimizer"].param_groups[0]["lr"])
    fixed = build(name)
    fixed["optimizer"] = torch.optim.AdamW(fixed["model"].parameters(), lr=1e-3)
    compare(name, fixed, 300, val_loss, "val MSE")


def v_oneepoch():
    name = "linear_decay_schedule_sized_for_one_epoch"
    kw = build(name)
    lrs = []
    for i in range(30):
        kw["optimizer"].step()
        kw["scheduler"].step()
        lrs.append(kw["optimizer"].param_groups[0]["lr"])
    print(f"  len(train_loader) = {len(kw['train_loader'])}; lr after 10 / 20 / 30 steps: "
          f"{lrs[9]:.1e} / {lrs[19]:.1e} / {lrs[29]:.1e}")
    fixed = build(name)
    fixed["scheduler"] = M.linear_schedule_with_warmup(fixed["optimizer"], 2, 600)
    compare(name, fixed, 600, val_acc)


def v_bf16():
    name = "bf16_weights_adam_updates_rounded_away"
    kw = build(name)
    before = [p.detach().clone() for p in kw["model"].parameters()]
    _, _, m = train(kw, 50)
    same = sum((a == b).sum().item() for a, b in zip(before, m.parameters()))
    print(f"  weights bit-identical after 50 AdamW steps: {same} of {sum(p.numel() for p in before)}")
    fixed = build(name)
    model = M.mlp()
    model.load_state_dict({k: v.float() for k, v in build(name)["model"].state_dict().items()})
    fixed["model"] = model
    fixed["optimizer"] = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.0)
    fixed["loss_fn"] = nn.CrossEntropyLoss()

    def acc_any(model, k):
        dt = next(model.parameters()).dtype
        return accuracy(model, k["val_loader"], lambda m, b: (m(b[0].to(dt)).argmax(-1), b[1]))
    compare(name, fixed, 300, acc_any)


def v_bn2():
    name = "batchnorm_mlp_micro_batches_of_2_accumulated_16x"
    kw = build(name)
    x, _ = next(iter(kw["train_loader"]))
    with torch.no_grad():
        h = kw["model"][1](kw["model"][0](x))
    print("  BatchNorm output on a micro-batch of 2, distinct |values|:", sorted({round(abs(v), 3) for v in h.flatten().tolist()})[:5])
    fixed = build(name)
    fixed["train_loader"] = loader(fixed["train_loader"].dataset, 32)
    fixed["accumulation_steps"] = 1
    compare(name, fixed, 300, val_acc, "val acc (eval mode)")


# --------------------------------------------------------------------------- data


def v_len():
    name = "keras_sequence_port_len_counts_batches"
    kw = build(name)
    seen = torch.cat([b[0] for b in kw["train_loader"]])
    print(f"  dataset holds {len(kw['train_loader'].dataset.x)} records; one epoch yields {len(seen)} samples, "
          f"{torch.unique(seen, dim=0).shape[0]} distinct")
    fixed = build(name)
    x, y = fixed["train_loader"].dataset.x, fixed["train_loader"].dataset.y
    fixed["train_loader"] = loader(TensorDataset(x, y), 32)
    compare(name, fixed, 400, val_acc)


def v_inplace():
    name = "meter_dataset_normalises_in_place_each_access"
    kw = build(name)
    ds = kw["train_loader"].dataset
    for epoch in range(3):
        for _ in kw["train_loader"]:
            pass
        print(f"  after epoch {epoch + 1}: stored table column std {ds.x.std(0).mean():.3g}, mean {ds.x.mean():.3g}")

    class OutOfPlace(D.MeterReadings):
        def __getitem__(self, i):
            return (self.x[i] - self.mean) / self.std, self.y[i]
    fixed = build(name)
    old, oldv = fixed["train_loader"].dataset, fixed["val_loader"].dataset
    fixed["train_loader"] = loader(OutOfPlace(old.x, old.y, old.mean, old.std), 64)
    fixed["val_loader"] = loader(OutOfPlace(oldv.x, oldv.y, oldv.mean, oldv.std), 110, shuffle=False)
    x, y = D.teacher_classes(3000, 12, 3, s=42)
    x = x * 10 + 50
    honest = loader(TensorDataset((x[2560:] - x[:2560].mean(0)) / x[:2560].std(0), y[2560:]), 110, shuffle=False)
    compare(name, fixed, 400, lambda m, k: accuracy(m, honest), "accuracy on freshly standardised validation rows")


def v_pad0():
    name = "ticket_vocab_ids_start_at_0_shared_with_padding"
    texts, y = D.tickets(s=43)
    vocab = D.build_vocab(texts[:2560])
    print(f"  vocab['account'] = {vocab['account']} (the padding id is 0)")
    fixed = build(name)
    vocab2 = {w: i + 2 for i, w in enumerate(sorted(vocab))}
    rows = [[vocab2.get(w, 1) for w in t.split()][:12] for t in texts]
    ids = torch.tensor([r + [0] * (12 - len(r)) for r in rows])
    torch0()
    fresh(fixed, D.TicketRouter(len(vocab2) + 2))
    fixed["train_loader"] = loader(TensorDataset(ids[:2560], y[:2560]), 64)
    fixed["val_loader"] = loader(TensorDataset(ids[2560:], y[2560:]), 110, shuffle=False)
    compare(name, fixed, 300, val_acc)


def v_bilinear():
    name = "scene_masks_downsampled_bilinear_then_truncated"
    imgs, masks = D.rectangle_scenes(s=44)
    near = F.interpolate(masks[:, None].float(), size=16, mode="nearest")[:, 0].long()
    bil = build(name)["train_loader"].dataset.masks
    obj = near[:1000] > 0
    print(f"  object pixels whose bilinear label differs from the nearest-neighbour label: "
          f"{(bil[obj] != near[:1000][obj]).float().mean():.3f}")

    class Nearest(D.SmallScenes):
        def __init__(self, imgs, masks, size=16):
            self.imgs = F.interpolate(imgs, size=size, mode="bilinear", align_corners=False)
            self.masks = F.interpolate(masks[:, None].float(), size=size, mode="nearest")[:, 0].long()
    fixed = build(name)
    fixed["train_loader"] = loader(Nearest(imgs[:1000], masks[:1000]), 32)
    val = Nearest(imgs[1000:], masks[1000:])

    def miou(model, _k):
        with torch.no_grad():
            p = model(val.imgs).argmax(1)
        ious = []
        for c in (1, 2, 3):
            inter = ((p == c) & (val.masks == c)).sum().item()
            union = ((p == c) | (val.masks == c)).sum().item()
            ious.append(inter / max(union, 1))
        return sum(ious) / 3
    compare(name, fixed, 300, miou, "val mIoU against nearest-resized masks")


def v_stop():
    name = "review_stopword_list_removes_negations"
    texts, y = D.restaurant_reviews(s=45)
    toks = [tuple(D.preprocess(t)) for t in texts[:2560]]
    labels = {}
    for t, lab in zip(toks, y[:2560].tolist()):
        labels.setdefault(t, set()).add(lab)
    print(f"  distinct processed training reviews seen with both labels: "
          f"{sum(len(v) == 2 for v in labels.values())} of {len(labels)}")
    keep = D.STOPWORDS - {"not", "no", "nor"}
    tokens = [[w for w in t.lower().split() if w not in keep] for t in texts]
    vocab = {w: i + 2 for i, w in enumerate(sorted({w for t in tokens[:2560] for w in t}))}
    ids = D.encode_tokens(tokens, vocab)
    fixed = build(name)
    torch0()
    fresh(fixed, D.ReviewGRU(len(vocab) + 2))
    fixed["train_loader"] = loader(TensorDataset(ids[:2560], y[:2560]), 64)
    fixed["val_loader"] = loader(TensorDataset(ids[2560:], y[2560:]), 110, shuffle=False)
    compare(name, fixed, 300, val_acc)


def v_window():
    name = "room_sensor_windows_standardised_per_window"
    ds = build(name)["train_loader"].dataset
    print(f"  temperature level range of the raw windows {ds.windows[:, :, 0].mean(1).min():.1f}-"
          f"{ds.windows[:, :, 0].mean(1).max():.1f} C; after per-window scaling every window's temperature mean is "
          f"{abs(ds[0][0].view(32, 3)[:, 0].mean().item()):.1e}")
    w, y = D.room_windows(s=46)
    mean, std = w[:2560].mean(dim=(0, 1)), w[:2560].std(dim=(0, 1))
    fixed = build(name)
    fixed["train_loader"] = loader(H.GlobalScaledWindows(w[:2560], y[:2560], mean, std), 64)
    fixed["val_loader"] = loader(H.GlobalScaledWindows(w[2560:], y[2560:], mean, std), 110, shuffle=False)
    compare(name, fixed, 300, val_acc)


def v_nan():
    name = "air_quality_nan_rows_dropped_from_features_only"
    X, y = D.air_quality_table(s=47)
    keep = ~np.isnan(X).any(axis=1)
    shifted = y[:keep.sum()]
    print(f"  rows dropped {int((~keep).sum())}; kept rows that still carry their own label: "
          f"{(shifted == y[keep]).mean():.3f} (chance 0.5)")
    fixed = build(name)
    x2, y2 = torch.from_numpy(X[keep]), torch.from_numpy(y[keep])
    fixed["train_loader"] = loader(TensorDataset(x2[:2400], y2[:2400]), 64)
    fixed["val_loader"] = loader(TensorDataset(x2[2400:], y2[2400:]), 100, shuffle=False)
    compare(name, fixed, 300, val_acc, "val acc (each split as it is labelled)")


CHECKS = {
    "char_lm_attention_heads_not_transposed": v_heads, "pos_tagger_logits_reshaped_to_bct": v_bct,
    "ticket_transformer_attention_mask_as_key_padding_mask": v_kpm,
    "keyword_conv1d_frames_viewed_as_channels_first": v_view, "sensor_vae_kl_summed_over_batch_axis": v_vae,
    "event_order_transformer_positional_encoding_on_batch_axis": v_pe,
    "signature_siamese_distance_summed_over_batch": v_siamese,
    "load_forecaster_same_padded_conv_sees_next_value": v_forecast,
    "ner_word_tags_not_aligned_to_subword_pieces": v_subword, "photo_tag_lists_padded_with_zero_mark_tag_0": v_tags0,
    "gpt2_pad_token_set_to_eos_then_masked": v_eos, "duplicate_questions_cosine_embedding_loss_0_1_labels": v_cosine,
    "listing_target_encoding_includes_own_label": v_target_enc,
    "vibration_denoiser_trained_towards_noisy_input": v_denoise,
    "churn_mlp_constant_weight_init": v_const, "fish_multitask_age_loss_weight_key_missing": v_lossweight,
    "linear_probe_checkpoint_keys_prefixed_strict_false": v_strict, "deep_mlp_weights_initialised_std_1": v_std1,
    "face_batch_hard_triplet_sqrt_of_zero_distance": v_sqrt, "cnn_param_groups_built_from_state_dict": v_statedict,
    "session_grucell_loop_detaches_hidden_every_step": v_detach,
    "sgd_static_loss_scale_never_unscaled": v_scale, "dp_gradient_noise_not_divided_by_batch_size": v_dp,
    "lr_range_test_scheduler_left_in_training": v_range,
    "finetune_restores_optimizer_state_with_annealed_lr": v_annealed,
    "linear_decay_schedule_sized_for_one_epoch": v_oneepoch, "bf16_weights_adam_updates_rounded_away": v_bf16,
    "batchnorm_mlp_micro_batches_of_2_accumulated_16x": v_bn2,
    "keras_sequence_port_len_counts_batches": v_len, "meter_dataset_normalises_in_place_each_access": v_inplace,
    "ticket_vocab_ids_start_at_0_shared_with_padding": v_pad0,
    "scene_masks_downsampled_bilinear_then_truncated": v_bilinear,
    "review_stopword_list_removes_negations": v_stop, "room_sensor_windows_standardised_per_window": v_window,
    "air_quality_nan_rows_dropped_from_features_only": v_nan,
}

if __name__ == "__main__":
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    missing = [n for n, c in CASES.items() if not c.healthy and n not in CHECKS]
    if missing:
        print("no check for:", missing)
    for n in sys.argv[1:] or list(CHECKS):
        print(n, flush=True)
        try:
            CHECKS[n]()
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            print(f"  RAISED {type(e).__name__}: {str(e)[:200]}")
