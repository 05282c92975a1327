"""The fact each broken case of set al rests on, printed by verify.py before the case is trained next to its fix
(attached to FIXES[name]["fact"]; nothing here imports optimus_preflight)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_al.registry import FIXES, load_all

CASES = load_all()


def _kw(name, fixed=False):
    fn = CASES[name].build
    return fn() if not fixed else FIXES[name]["fixed"]()


def fact(name):
    def register(fn):
        FIXES[name]["fact"] = fn
        return fn
    return register


@fact("al_hwc_reshape_not_permute")
def _():
    t = torch.arange(2 * 2 * 3).reshape(1, 2, 2, 3)
    print("  HWC pixel (0,0) =", t[0, 0, 0].tolist(), "| reshape ch0 =", t.reshape(1, 3, 2, 2)[0, 0].flatten().tolist(),
          "| permute ch0 =", t.permute(0, 3, 1, 2)[0, 0].flatten().tolist())


@fact("al_hn_view_mixes_batch")
def _():
    h = torch.arange(2 * 3).reshape(2, 3, 1)          # (layers, batch, hidden): value = layer*3 + sample
    print("  h_n.view(3, -1) rows:", h.view(3, -1).tolist(), "| permute rows:", h.permute(1, 0, 2).reshape(3, -1).tolist())


@fact("al_cosine_sim_default_dim")
def _():
    z1, z2 = torch.randn(32, 64), torch.randn(32, 64)
    print("  default dim:", tuple(F.cosine_similarity(z1[:, None], z2[None]).shape), "| dim=-1:",
          tuple(F.cosine_similarity(z1[:, None], z2[None], dim=-1).shape))


@fact("al_transformer_not_batch_first")
def _():
    m = _kw("al_transformer_not_batch_first")["model"]
    print("  encoder layer batch_first =", m.enc.layers[0].self_attn.batch_first, "; input is (batch, seq, feature)")


@fact("al_seq_first_logits_flatten")
def _():
    kw = _kw("al_seq_first_logits_flatten")
    tok, tags = next(iter(kw["train_loader"]))
    print("  logits", tuple(kw["model"](tok).shape), "vs tags", tuple(tags.shape), "both flattened to",
          tags.numel(), "rows")


@fact("al_relu_head_standardized_target")
def _():
    y = torch.cat([b[1] for b in _kw("al_relu_head_standardized_target")["train_loader"]])
    print(f"  share of standardized targets below 0: {(y < 0).float().mean():.2f}; the head ends in ReLU")


@fact("al_decoder_input_not_shifted")
def _():
    x, y = next(iter(_kw("al_decoder_input_not_shifted")["train_loader"]))
    print("  input[0,:5] =", x[0, :5].tolist(), " target[0,:5] =", y[0, :5].tolist())


@fact("al_ntxent_self_positive")
def _():
    print("  labels = arange(2N): row i's target is column i, the unmasked self-similarity (always 1/T)")


@fact("al_mask_255_bce")
def _():
    _, t = next(iter(_kw("al_mask_255_bce")["train_loader"]))
    print("  target values:", torch.unique(t).tolist(), "; BCEWithLogits(logit 2, target 255) =",
          round(F.binary_cross_entropy_with_logits(torch.tensor(2.0), torch.tensor(255.0)).item(), 1))


@fact("al_ner_labels_not_subword_aligned")
def _():
    from benchmarks.blind_preflight_al.cases_targets import ner_batch
    ids, _, lab, gold = ner_batch(1, 19, False)
    print("  ids   ", ids[0, :10].tolist(), "\n  labels", lab[0, :10].tolist(), "\n  gold  ", gold[0, :10].tolist())


@fact("al_reentrant_checkpoint_frozen_embed")
def _():
    kw = _kw("al_reentrant_checkpoint_frozen_embed")
    m = kw["model"]
    x, y = next(iter(kw["train_loader"]))
    F.cross_entropy(m(x), y).backward()
    print("  block grad is None:", m.blocks[0].ff[0].weight.grad is None, "| head grad is None:", m.head.weight.grad is None)


@fact("al_layerscale_param_in_forward")
def _():
    m = _kw("al_layerscale_param_in_forward")["model"]
    print("  registered parameters:", [n for n, _ in m.named_parameters()], "(no gamma)")


@fact("al_numpy_roundtrip_in_forward")
def _():
    kw = _kw("al_numpy_roundtrip_in_forward")
    m = kw["model"]
    x, y = next(iter(kw["train_loader"]))
    F.cross_entropy(m(x), y).backward()
    print("  stem grad is None:", m.stem.weight.grad is None)


@fact("al_module_requires_grad_attr")
def _():
    m = _kw("al_module_requires_grad_attr")["model"]
    print("  trainable:", [n for n, p in m.named_parameters() if p.requires_grad])


@fact("al_head_replaced_after_optimizer")
def _():
    kw = _kw("al_head_replaced_after_optimizer")
    ids = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    print("  model.fc.weight in optimizer:", id(kw["model"].fc.weight) in ids)


@fact("al_hf_schedule_total_in_epochs")
def _():
    kw = _kw("al_hf_schedule_total_in_epochs")
    lrs = []
    for _ in range(6):
        kw["optimizer"].step()
        kw["scheduler"].step()
        lrs.append(kw["optimizer"].param_groups[0]["lr"])
    print("  lr after steps 1..6:", [f"{v:.1e}" for v in lrs])


@fact("al_lambdalr_returns_lr")
def _():
    kw = _kw("al_lambdalr_returns_lr")
    for _ in range(150):
        kw["optimizer"].step()
        kw["scheduler"].step()
    print(f"  lr after 150 steps: {kw['optimizer'].param_groups[0]['lr']:.1e}")


@fact("al_pure_bf16_weights")
def _():
    w = torch.tensor(0.3, dtype=torch.bfloat16)
    print("  bf16 0.3 + 5e-4 == 0.3:", bool((w + torch.tensor(5e-4, dtype=torch.bfloat16)) == w))


@fact("al_class_weight_frequency")
def _():
    print("  CrossEntropyLoss weight:", [round(v, 3) for v in _kw("al_class_weight_frequency")["loss_fn"].weight.tolist()])


@fact("al_multitask_unscaled_loss")
def _():
    b = next(iter(_kw("al_multitask_unscaled_loss")["train_loader"]))
    print(f"  price target std {b[1].std():.3g}; MSE at init ~ {b[1].pow(2).mean():.3g} vs CE ~ 1.1")


@fact("al_image_mask_separate_random")
def _():
    kw = _kw("al_image_mask_separate_random")
    d = kw["train_loader"].dataset
    torch.manual_seed(0)
    agree = 0
    for _ in range(40):
        img, mask = d[0]
        agree += bool((img * (mask - mask.mean())).sum() > 0)
    print(f"  image/mask foreground agree in {agree}/40 draws")


@fact("al_padding_mask_inverted")
def _():
    b = next(iter(_kw("al_padding_mask_inverted")["train_loader"]))
    print("  src_key_padding_mask row 0 (True = ignored):", b[1][0].bool().tolist())


@fact("al_np_resize_spectrogram")
def _():
    a = np.arange(16 * 40).reshape(16, 40)
    print("  np.resize(16x40 -> 16x16) last row holds source rows", sorted(set((np.resize(a, (16, 16))[-1] // 40).tolist())))


@fact("al_category_codes_per_batch")
def _():
    b1, b2 = list(_kw("al_category_codes_per_batch")["train_loader"])[:2]
    print("  first codes of batch 1:", b1[0][:6].tolist(), "| batch 2:", b2[0][:6].tolist(), "(always 0, 1, 2, ...)")


@fact("al_truncation_drops_verdict")
def _():
    x, _ = next(iter(_kw("al_truncation_drops_verdict")["train_loader"]))
    print(f"  samples whose kept tokens hold a verdict word (ids 2..9): {((x >= 2) & (x <= 9)).any(1).float().mean():.2f}")
