"""Per broken case of set q: the one-line fix verify.py trains next to it, the metric both are scored on, and a
function printing the measurable fact the bug rests on (no preflight involved)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# imported in family order, so that the cases register (and verify lists them) shapes, targets, ..., data
from benchmarks.blind_preflight_q import cases_shapes as S  # isort: skip
from benchmarks.blind_preflight_q import cases_targets as T  # isort: skip
from benchmarks.blind_preflight_q import cases_trained as W  # isort: skip
from benchmarks.blind_preflight_q import cases_mechanics as M  # isort: skip
from benchmarks.blind_preflight_q import cases_data as D  # isort: skip
from benchmarks.blind_preflight_q.registry import acc_of, fix, fixed_of, mean_over, rmse_of

first = lambda kw: next(iter(kw["train_loader"]))  # noqa: E731
argmax_of = lambda m, b: (m(b[0]).argmax(-1), b[1])  # noqa: E731
regress = lambda m, b: (m(b[0]), b[1])  # noqa: E731


def say(*parts):
    print("  fact:", *parts, flush=True)


# ------------------------------------------------------------------------------------------------------ shapes


def fact_led():
    imgs, labels = S.led_images(4, 11)
    wrong, right = S.to_torch_images(imgs, False), S.to_torch_images(imgs, True)
    say(f"reshape gives {tuple(wrong.shape)} like permute, but only {(wrong == right).float().mean():.0%} of the "
        f"values sit where permute puts them; reshape's channel 0, row 0 = {wrong[0, 0, 0, :6].numpy().round(2)}, "
        f"the red plane's row 0 = {right[0, 0, 0, :6].numpy().round(2)}")


def fact_click():
    kw = S.clickstream_padding_mask_inverted()
    ids, mask, _ = first(kw)
    say(f"attention_mask[0] = {mask[0].tolist()}; passed as src_key_padding_mask it is True on the "
        f"{int(mask[0].sum())} real positions (True = 'do not attend'), False only on the padding")


def fact_vib():
    kw = S.vibration_lstm_not_batch_first()
    x, _ = first(kw)
    model = kw["model"].eval()
    with torch.no_grad():
        a = model(x)[5]
        x2 = x.clone()
        x2[:5] = torch.randn_like(x2[:5])
        b = model(x2)[5]
        x3 = x.clone()
        x3[5, :-1] = torch.randn_like(x3[5, :-1])
        c = model(x3)[5]
    say(f"input {tuple(x.shape)} = (batch, time, features), lstm.batch_first={model.lstm.batch_first}; sample 5's "
        f"logits change by {float((a - b).abs().max()):.3f} when samples 0-4 change and by {float((a - c).abs().max()):.3f} "
        f"when its own first 29 time steps change")


def fact_tx():
    kw = S.transactions_attention_softmax_singleton()
    x, _ = first(kw)
    model = kw["model"]
    with torch.no_grad():
        scores = model.score(model.encoder(x))
        w = torch.softmax(scores, dim=model.softmax_dim)
    say(f"scores {tuple(scores.shape)}; softmax(dim={model.softmax_dim}) weights min {float(w.min()):.3f} max "
        f"{float(w.max()):.3f}, sum over the 10 transactions {float(w.sum(1).mean()):.1f}")


def fact_clip():
    kw = S.clip_normalize_batch_dim()
    img, txt = first(kw)
    model = kw["model"]
    with torch.no_grad():
        z = F.normalize(model.image_tower(img), dim=model.norm_dim)
        logits = model(img, txt)
    say(f"after F.normalize(dim={model.norm_dim}) row norms are {float(z.norm(dim=1).min()):.3f}..{float(z.norm(dim=1).max()):.3f}, "
        f"column norms {float(z.norm(dim=0).mean()):.3f}; logits span only {float(logits.min()):.2f}..{float(logits.max()):.2f}")


fix("led_color_reshape_hwc", fixed_of(S.led_color_reshape_hwc), acc_of(argmax_of), "val accuracy", fact_led, 250)
fix("clickstream_padding_mask_inverted", fixed_of(S.clickstream_padding_mask_inverted),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val accuracy", fact_click, 300)
fix("vibration_lstm_not_batch_first", fixed_of(S.vibration_lstm_not_batch_first), acc_of(argmax_of), "val accuracy",
    fact_vib, 300)
fix("transactions_attention_softmax_singleton", fixed_of(S.transactions_attention_softmax_singleton),
    acc_of(argmax_of), "val accuracy", fact_tx, 300)
fix("clip_normalize_batch_dim", fixed_of(S.clip_normalize_batch_dim),
    acc_of(lambda m, b: ((lg := m(b[0], b[1])).argmax(1), torch.arange(lg.size(0), device=lg.device))),
    "val image->caption top-1 retrieval", fact_clip, 300)


# ------------------------------------------------------------------------------------------------------ targets


def dice(model, kw):
    def fn(m, b):
        p, g = (m(b[0]) > 0).float(), (b[1] > 0).float()
        return 2 * float((p * g).sum()), float(p.sum() + g.sum())
    return mean_over(model, kw["val_loader"], fn)


def fact_lesion():
    kw = T.lesion_mask_255_bce()
    _, mask = first(kw)
    lossf = nn.BCEWithLogitsLoss()
    say(f"mask values {sorted(torch.unique(mask).tolist())}; BCEWithLogitsLoss(logit, 255) = "
        f"{float(lossf(torch.tensor([5.0]), torch.tensor([255.0]))):.0f} at logit 5 and "
        f"{float(lossf(torch.tensor([50.0]), torch.tensor([255.0]))):.0f} at logit 50 (unbounded below)")


def fact_news():
    say(f"NLLLoss(raw logits) = -logit[y]: NLLLoss([[2., 0.]], [0]) = "
        f"{float(nn.NLLLoss()(torch.tensor([[2.0, 0.0]]), torch.tensor([0]))):.1f}, with logits x10 = "
        f"{float(nn.NLLLoss()(torch.tensor([[20.0, 0.0]]), torch.tensor([0]))):.1f}; CrossEntropyLoss gives "
        f"{float(nn.CrossEntropyLoss()(torch.tensor([[2.0, 0.0]]), torch.tensor([0]))):.3f}")


def fact_sig():
    kw = T.signature_contrastive_label_flipped()
    x1, x2, y = first(kw)
    d_same = (x1 - x2).norm(dim=1)[y == 1].mean()
    d_diff = (x1 - x2).norm(dim=1)[y == 0].mean()
    say(f"input distance: y=1 pairs {float(d_same):.2f}, y=0 pairs {float(d_diff):.2f} (y=1 = same writer); the loss "
        f"(1-y)*d^2 + y*relu(m-d)^2 is zero for a y=1 pair only when d >= margin")


def fact_heat():
    kw = T.heat_load_relu_output()
    _, y = first(kw)
    with torch.no_grad():
        out = kw["model"](kw["val_loader"].dataset.tensors[0])
    say(f"{float((y < 0).float().mean()):.0%} of the standardized targets are negative; the model's outputs range "
        f"{float(out.min()):.2f}..{float(out.max()):.2f}")


def micro_f1(model, kw):
    tp = fp = fn_ = 0.0
    was = model.training
    model.eval()
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            p = (torch.sigmoid(model(x)) > 0.5).float()
            tp, fp, fn_ = tp + float((p * y).sum()), fp + float((p * (1 - y)).sum()), fn_ + float(((1 - p) * y).sum())
    model.train(was)
    return 2 * tp / max(2 * tp + fp + fn_, 1.0)


def fact_music():
    kw = T.music_tags_multilabel_ce()
    _, y = first(kw)
    logits = torch.randn(4, 8)
    ce = nn.CrossEntropyLoss()
    say(f"tags per clip in a batch: {np.bincount(y.sum(1).int().numpy(), minlength=4).tolist()} (0..3); "
        f"CrossEntropyLoss is unchanged when every logit is shifted by +5 ({float(ce(logits, y[:4])):.4f} vs "
        f"{float(ce(logits + 5, y[:4])):.4f}) while sigmoid(logit) > 0.5 depends on the shift")


fix("lesion_mask_255_bce", fixed_of(T.lesion_mask_255_bce), dice, "val Dice", fact_lesion, 250)
fix("news_nllloss_raw_logits", fixed_of(T.news_nllloss_raw_logits), acc_of(argmax_of), "val accuracy", fact_news, 300)
fix("signature_contrastive_label_flipped", fixed_of(T.signature_contrastive_label_flipped),
    acc_of(lambda m, b: ((F.pairwise_distance(m(b[0]), m(b[1])) < 0.5).float(), b[2])),
    "val verification accuracy (distance < margin / 2 = same writer)", fact_sig, 300)
fix("heat_load_relu_output", fixed_of(T.heat_load_relu_output), rmse_of(regress), "val RMSE (standardized)",
    fact_heat, 300, higher=False)
fix("music_tags_multilabel_ce", fixed_of(T.music_tags_multilabel_ce), micro_f1, "val micro-F1 at sigmoid > 0.5",
    fact_music, 300)


# ------------------------------------------------------------------------------------------------------ what is trained


def fact_fm():
    kw = W.ctr_fm_factors_plain_tensor()
    model, opt = kw["model"], kw["optimizer"]
    n_opt = sum(p.numel() for g in opt.param_groups for p in g["params"])
    say(f"V {tuple(model.V.shape)} requires_grad={model.V.requires_grad}, is nn.Parameter: "
        f"{isinstance(model.V, nn.Parameter)}; parameters() = {[n for n, _ in model.named_parameters()]}, "
        f"optimizer holds {n_opt} numbers of the {n_opt + model.V.numel()} the FM uses")


def fact_heads():
    kw = W.horizon_heads_list_multiplied()
    heads = kw["model"].heads
    say(f"{len(heads)} heads, {len({id(h) for h in heads})} distinct object(s); "
        f"{sum(p.numel() for p in heads.parameters())} head parameters")


def fact_ecg():
    kw = W.ecg_model_reinstantiated()
    opt_ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    mine = list(kw["model"].parameters())
    say(f"{sum(id(p) in opt_ids for p in mine)} of the model's {len(mine)} parameter tensors are in the optimizer")


def fact_emb():
    kw = W.clinical_embeddings_from_pretrained_frozen()
    emb = kw["model"].embedding
    say(f"embedding.weight {tuple(emb.weight.shape)} requires_grad={emb.weight.requires_grad} "
        f"(from_pretrained default freeze=True); 360 of its 400 rows are random out-of-vocabulary vectors")


def fact_hook():
    kw = W.audio_hook_detached_embedding()
    model = kw["model"]
    x, y = first(kw)
    F.cross_entropy(model(x), y).backward()
    enc = [p.grad for p in model.encoder.parameters()]
    say(f"after backward: encoder grads None for {sum(g is None for g in enc)}/{len(enc)} tensors; head grad norm "
        f"{float(model.head.weight.grad.norm()):.3f}")
    model.zero_grad(set_to_none=True)


fix("ctr_fm_factors_plain_tensor", fixed_of(W.ctr_fm_factors_plain_tensor),
    acc_of(lambda m, b: ((m(b[0]) > 0).long(), b[1].long())), "val click accuracy", fact_fm, 300)
fix("horizon_heads_list_multiplied", fixed_of(W.horizon_heads_list_multiplied), rmse_of(regress),
    "val RMSE over the 6 horizons", fact_heads, 300, higher=False)
fix("ecg_model_reinstantiated", fixed_of(W.ecg_model_reinstantiated), acc_of(argmax_of), "val accuracy", fact_ecg, 250)
fix("clinical_embeddings_from_pretrained_frozen", fixed_of(W.clinical_embeddings_from_pretrained_frozen),
    acc_of(argmax_of), "val accuracy", fact_emb, 300)
fix("audio_hook_detached_embedding", fixed_of(W.audio_hook_detached_embedding), acc_of(argmax_of), "val accuracy",
    fact_hook, 300)


# ------------------------------------------------------------------------------------------------------ mechanics


def lrs_over(kw, steps, at):
    opt, sched = kw["optimizer"], kw["scheduler"]
    out = {}
    for step in range(steps):
        if step in at:
            out[step] = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
    return ", ".join(f"step {k}: {v:.2e}" for k, v in out.items())


def fact_lambda():
    kw = M.warmup_lambda_returns_lr()
    say(f"learning rate {lrs_over(kw, 300, (0, 49, 100, 299))} (base lr {M.BASE_LR})")


def fact_bert():
    kw = M.bert_schedule_total_steps_divided_twice()
    say(f"len(train_loader)={len(kw['train_loader'])}, max_steps={kw['max_steps']}; learning rate "
        f"{lrs_over(kw, 320, (0, 5, 10, 100, 319))}")


def fact_eps():
    kw = M.adam_eps_tf_inception()
    model, opt = kw["model"], kw["optimizer"]
    x, y = first(kw)
    F.cross_entropy(model(x), y).backward()
    g = torch.cat([p.grad.flatten() for p in model.parameters()]).abs()
    say(f"eps={opt.param_groups[0]['eps']}; |grad| median {float(g.median()):.1e}, max {float(g.max()):.1e}: "
        f"sqrt(v) << eps, so Adam's step is about lr * |g| / eps")
    opt.zero_grad(set_to_none=True)


def fact_yield():
    kw = M.yield_clip_norm_from_detr()
    model = kw["model"]
    x, y = first(kw)
    F.mse_loss(model(x), y).backward()
    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
    say(f"gradient norm at the first step {float(norm):.1f} vs clip_grad_norm={kw['clip_grad_norm']}: the step is "
        f"scaled by {float(kw['clip_grad_norm'] / norm):.4f}")
    model.zero_grad(set_to_none=True)


def fact_sum():
    kw = M.denoiser_sum_reduction_sgd()
    x, y = first(kw)
    with torch.no_grad():
        out = kw["model"](x)
    say(f"reduction='sum' loss {float(kw['loss_fn'](out, y)):.1f} vs mean {float(F.mse_loss(out, y)):.4f}: "
        f"gradients {y.numel()}x larger at SGD lr {kw['optimizer'].param_groups[0]['lr']}")


fix("warmup_lambda_returns_lr", fixed_of(M.warmup_lambda_returns_lr), acc_of(argmax_of), "val accuracy", fact_lambda,
    300)
fix("bert_schedule_total_steps_divided_twice", fixed_of(M.bert_schedule_total_steps_divided_twice),
    acc_of(lambda m, b: (m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1),
                         b["labels"])), "val accuracy", fact_bert, 320)
fix("adam_eps_tf_inception", fixed_of(M.adam_eps_tf_inception), acc_of(argmax_of), "val accuracy", fact_eps, 300)
fix("yield_clip_norm_from_detr", fixed_of(M.yield_clip_norm_from_detr), rmse_of(regress), "val RMSE (t/ha)",
    fact_yield, 300, higher=False)
fix("denoiser_sum_reduction_sgd", fixed_of(M.denoiser_sum_reduction_sgd), rmse_of(regress), "val RMSE to the clean "
    "patch", fact_sum, 300, higher=False)


# ------------------------------------------------------------------------------------------------------ data


def fact_pupil():
    kw = D.pupil_flip_keypoint_not_mirrored()
    ds = kw["train_loader"].dataset
    torch.manual_seed(0)
    off = []
    for i in range(200):
        img, pt = ds[i]
        col = int(img[0].min(0).values.argmin())  # darkest column = pupil
        off.append(abs(col / 23 - float(pt[0])))
    off = np.array(off)
    say(f"|pupil column - target x| over 200 training samples: {np.mean(off < 0.1):.0%} within 0.1, "
        f"{np.mean(off >= 0.1):.0%} off (the flipped ones), mean {off.mean():.2f}")


def fact_fault():
    kw = D.fault_sorted_tail_validation()
    ytr = kw["train_loader"].dataset.tensors[1]
    yva = kw["val_loader"].dataset.tensors[1]
    say(f"train class counts {np.bincount(ytr.numpy(), minlength=4).tolist()}, val class counts "
        f"{np.bincount(yva.numpy(), minlength=4).tolist()}")


def fact_robot():
    kw = D.robot_demo_obs_aliasing()
    x, y = kw["train_loader"].dataset.tensors
    say(f"{len(x)} demonstration rows, {len(torch.unique(x, dim=0))} distinct observation(s), "
        f"{len(torch.unique(y))} distinct expert actions")


def fact_load():
    kw = D.load_rows_shuffled_before_windowing()
    x, y = kw["train_loader"].dataset.tensors
    xt, yt = D.load_test_set()[0]
    c = np.corrcoef(x[:, -1].numpy(), y[:, 0].numpy())[0, 1]
    ct = np.corrcoef(xt[:, -1].numpy(), yt[:, 0].numpy())[0, 1]
    say(f"corr(last input hour, target) = {c:.2f} in the training windows vs {ct:.2f} in ordered windows")


def fact_readm():
    x, y = D.admissions(3000, 253)
    complete = ~np.isnan(x).any(axis=1)
    say(f"{int((~complete).sum())} incomplete rows dropped from X; y[:len(X)] disagrees with y[complete] on "
        f"{np.mean(y[:complete.sum()] != y[complete]):.0%} of the rows")


fix("pupil_flip_keypoint_not_mirrored", fixed_of(D.pupil_flip_keypoint_not_mirrored), rmse_of(regress),
    "val RMSE of the pupil centre (image widths)", fact_pupil, 300, higher=False)
fix("fault_sorted_tail_validation", fixed_of(D.fault_sorted_tail_validation), acc_of(argmax_of, D.machine_test_set),
    "accuracy on a held-out balanced test set", fact_fault, 250)
fix("robot_demo_obs_aliasing", fixed_of(D.robot_demo_obs_aliasing), acc_of(argmax_of, D.robot_test_set),
    "expert-action accuracy on correctly collected test demos", fact_robot, 300)
fix("load_rows_shuffled_before_windowing", fixed_of(D.load_rows_shuffled_before_windowing),
    rmse_of(regress, D.load_test_set), "next-hour RMSE on an ordered test series", fact_load, 300, higher=False)
fix("readmission_dropna_features_only", fixed_of(D.readmission_dropna_features_only),
    acc_of(argmax_of, D.readmission_test_set), "accuracy on complete held-out admissions", fact_readm, 300)
