"""The fact each broken case of set an rests on, printed by ``verify.py`` before the case trains (no preflight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_an import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_an.registry import FIXES


def fact(name):
    def attach(fn):
        FIXES[name]["fact"] = fn
        return fn
    return attach


@fact("an_shapes_seg_logits_view")
def _seg_view():
    logits = torch.arange(2 * 3 * 2 * 2).reshape(2, 3, 2, 2)
    print("  logits.view(-1, 3)[0] =", logits.view(-1, 3)[0].tolist(),
          "| permute(0,2,3,1).reshape(-1,3)[0] =", logits.permute(0, 2, 3, 1).reshape(-1, 3)[0].tolist())


@fact("an_shapes_gru_hn_view")
def _gru():
    gru = nn.GRU(2, 3, num_layers=2, batch_first=True, bidirectional=True)
    _, h = gru(torch.randn(5, 4, 2))
    same = torch.equal(h.view(5, -1)[0], torch.cat([h[0, 0], h[0, 1], h[0, 2], h[0, 3]]))
    print("  h_n", tuple(h.shape), "- h_n.view(N, -1)[0] is layer-0 forward state of clips 0, 1, 2, 3:", same)


@fact("an_shapes_box_l1_broadcast")
def _box():
    print("  (pred (8, 4) - target (8, 1, 4)).shape =", tuple((torch.zeros(8, 4) - torch.zeros(8, 1, 4)).shape))


@fact("an_shapes_hwc_reshape")
def _hwc():
    img = torch.zeros(1, 4, 4, 3)
    img[..., 0] = 1.0  # a pure red image
    print("  red HWC image: reshape -> channel means", img.reshape(1, 3, 4, 4).mean((2, 3)).tolist(),
          "| permute ->", img.permute(0, 3, 1, 2).mean((2, 3)).tolist())


@fact("an_shapes_mel_pool_axis")
def _mel():
    x, y = cases_shapes.tone_mels(4, 0)
    print("  x", tuple(x.shape), "mean(dim=1) ->", tuple(x.mean(1).shape), "(frames, not mels); labels", y.tolist())


@fact("an_targets_multihot_ce")
def _multihot():
    logits = torch.tensor([[5.0, 5.0, -5.0]])
    print("  CE on multi-hot [1, 1, 0] with logits [5, 5, -5]:",
          round(F.cross_entropy(logits, torch.tensor([[1.0, 1.0, 0.0]])).item(), 3),
          "- same loss with all logits shifted by -10:",
          round(F.cross_entropy(logits - 10, torch.tensor([[1.0, 1.0, 0.0]])).item(), 3), "(sigmoid decisions flip)")


@fact("an_targets_mask_255_bce")
def _mask255():
    print("  BCEWithLogits(logit=3, target=255) =",
          round(F.binary_cross_entropy_with_logits(torch.tensor(3.0), torch.tensor(255.0)).item(), 1))


@fact("an_targets_freq_class_weights")
def _freq():
    kw = cases_targets.build_freq_class_weights()
    print("  CrossEntropyLoss weight =", [round(v, 3) for v in kw["loss_fn"].weight.tolist()])


@fact("an_targets_subword_labels")
def _subword():
    ids, _, lab = cases_targets.ner_batches(1, 0, fixed=False)
    _, _, ok = cases_targets.ner_batches(1, 0, fixed=True)
    print("  ids   ", ids[0, :12].tolist(), "\n  labels", lab[0, :12].tolist(), "\n  aligned", ok[0, :12].tolist())


@fact("an_targets_ce_single_logit")
def _single():
    logit = torch.randn(4, 1, requires_grad=True)
    loss = nn.CrossEntropyLoss()(logit, torch.tensor([[1.0], [0.0], [1.0], [0.0]]))
    loss.backward()
    print("  CE over one logit:", loss.item(), "grad", logit.grad.abs().sum().item())


@fact("an_trained_gpt2_tied_frozen_wte")
def _tied():
    kw = cases_trained.build_gpt2_tied_frozen_wte()
    m = kw["model"]
    print("  lm_head.weight is wte.weight:", m.lm_head.weight is m.transformer.wte.weight,
          "| lm_head requires_grad:", m.lm_head.weight.requires_grad)


@fact("an_trained_pos_buffer")
def _pos():
    m = cases_trained.OrderNet(fixed=False)
    print("  'pos' in parameters:", any(n == "pos" for n, _ in m.named_parameters()),
          "| in buffers:", any(n == "pos" for n, _ in m.named_buffers()))


@fact("an_trained_param_groups_miss")
def _groups():
    kw = cases_trained.build_param_groups_miss()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  parameters outside every group:", [n for n, p in kw["model"].named_parameters() if id(p) not in held])


@fact("an_trained_nograd_backbone")
def _nograd():
    kw = cases_trained.build_nograd_backbone()
    x, y = next(iter(kw["train_loader"]))
    nn.CrossEntropyLoss()(kw["model"](x), y).backward()
    print("  backbone params with a gradient:",
          sum(p.grad is not None for p in kw["model"].backbone.parameters()), "of",
          len(list(kw["model"].backbone.parameters())))


@fact("an_trained_ckpt_reentrant")
def _ckpt():
    kw = cases_trained.build_ckpt_reentrant()
    x, y = next(iter(kw["train_loader"]))
    nn.CrossEntropyLoss()(kw["model"](x), y).backward()
    print("  encoder grads:", [p.grad is not None for p in kw["model"].encoder.parameters()])


@fact("an_mech_ste_no_return")
def _ste():
    x = torch.randn(5, requires_grad=True)
    cases_mechanics.BinarizeSTE.apply(x).sum().backward()
    print("  grad through the STE:", x.grad)


@fact("an_mech_bf16_weights")
def _bf16():
    w = torch.tensor(0.1, dtype=torch.bfloat16)
    print("  bf16 0.1 + 1e-4 == 0.1:", bool(w + 1e-4 == w))


@fact("an_mech_warmup_in_samples")
def _warm():
    kw = cases_mechanics.build_warmup_in_samples()
    opt, sch = kw["optimizer"], kw["scheduler"]
    for _ in range(kw["max_steps"]):
        opt.step()
        sch.step()
    print("  LR after the whole run (", kw["max_steps"], "steps):", opt.param_groups[0]["lr"], "of peak 2e-3")


@fact("an_mech_accum_double_div")
def _accum():
    print("  loss_fn returns loss /", cases_mechanics.ACCUM, "and the loop divides by accumulation_steps =",
          cases_mechanics.ACCUM, "again")


@fact("an_mech_dropout_keep_prob")
def _drop():
    kw = cases_mechanics.build_dropout_keep_prob()
    print("  dropout p:", [m.p for m in kw["model"] if isinstance(m, nn.Dropout)])


@fact("an_data_inplace_norm_cache")
def _inplace():
    kw = cases_data.build_inplace_norm_cache()
    ds = kw["train_loader"].dataset
    a = ds[0][0].mean().item()
    b = ds[0][0].mean().item()
    print(f"  the same clip read twice: mean {a:.2f} then {b:.2f}")


@fact("an_data_mask_bilinear")
def _bilinear():
    m = torch.tensor([[0.0, 2.0, 2.0, 2.0]])[None, None]
    out = F.interpolate(m, size=(1, 7), mode="bilinear", align_corners=False)
    print("  mask [0, 2, 2, 2] bilinear x1.75 then .long():", out.long()[0, 0, 0].tolist())


@fact("an_data_val_tag_vocab")
def _vocab():
    _, tr = cases_data.tagged_clips(2000, 43)
    _, va = cases_data.tagged_clips(400, 44, drop_tag="car_horn")
    print("  train vocab", sorted({t for ts in tr for t in ts})[:4], "| val vocab", sorted({t for ts in va for t in ts})[:4])


@fact("an_data_val_unscaled")
def _unscaled():
    kw = cases_data.build_val_unscaled()
    print("  train input std", round(kw["train_loader"].dataset.tensors[0].std().item(), 2),
          "| val input std", round(kw["val_loader"].dataset.tensors[0].std().item(), 2))


@fact("an_data_seg_flip_independent")
def _flip():
    x, m = cases_data.side_objects(200, 0)
    ds = cases_data.FlipSeg(x, m, fixed=False, s=0)
    bad = 0
    for i in range(200):
        img, mask = ds[i]
        bad += int((((img[0] > 0.5) & (mask == 1)).sum() < (mask == 1).sum() // 2).item())
    print(f"  image/mask pairs out of register: {bad}/200")
