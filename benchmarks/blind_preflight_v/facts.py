"""The fact each broken case of set v rests on, printed by ``verify.py`` before the case is trained next to its fix
(no preflight involved). Importing this module attaches each function to ``FIXES[name]["fact"]``."""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup

from benchmarks.blind_preflight_v.registry import FIXES, load_all

load_all()                                                # the family modules, in the registry's order
S, T, W, M, D = (importlib.import_module(f"benchmarks.blind_preflight_v.cases_{family}")
                 for family in ("shapes", "targets", "trained", "mechanics", "data"))
FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        return fn
    return register


def say(text):
    print("  fact: " + text)


@fact("fusion_mha_default_seq_first")
def _():
    mha = nn.MultiheadAttention(8, 2)                     # batch_first=False
    q, kv = torch.randn(4, 3, 8), torch.randn(4, 3, 8)
    out = mha(q, kv, kv)[0]
    kv2 = kv.clone()
    kv2[1] += 5.0                                         # change sample 1's keys only
    moved = (mha(q, kv2, kv2)[0][0] - out[0]).abs().max().item()
    say(f"without batch_first, changing sample 1's patches moves sample 0's output by {moved:.3f} (not 0)")


@fact("gru_final_states_view_mixes_samples")
def _():
    h = torch.arange(2 * 4 * 2).reshape(2, 4, 2)         # (layers, batch, hidden), value = position in memory
    say(f"h_n (2, 4, 2).view(4, -1)[0] = {h.view(4, -1)[0].tolist()}: layer 0 of samples 0 and 1; "
        f"permute(1, 0, 2).reshape(4, -1)[0] = {h.permute(1, 0, 2).reshape(4, -1)[0].tolist()}")


@fact("har_windows_view_not_transpose")
def _():
    x = torch.arange(6 * 3).reshape(1, 6, 3)            # (batch, time, axes)
    say(f"x (1, 6, 3).view(1, 3, 6)[0, 0] = {x.view(1, 3, 6)[0, 0].tolist()} (axes interleaved); "
        f"transpose(1, 2)[0, 0] = {x.transpose(1, 2)[0, 0].tolist()} (axis 0 over time)")


@fact("session_lists_default_collate")
def _():
    batch = next(iter(DataLoader(S.Sessions(S._sessions(4, torch.Generator().manual_seed(0))), batch_size=4)))
    items = batch["items"]
    say(f"default_collate gives a {type(items).__name__} of {len(items)} tensors of shape {tuple(items[0].shape)}; "
        f"torch.stack -> {tuple(torch.stack(items).shape)}, torch.stack(dim=1) -> "
        f"{tuple(torch.stack(items, 1).shape)}")


@fact("melspec_pooled_over_mel_axis")
def _():
    x, y = S._band_specs(400, torch.Generator().manual_seed(0))
    by_mel = x.mean(2).argmax(1)
    by_time = x.mean(1).argmax(1)
    say(f"(B, n_mels, time) = {tuple(x.shape[1:])}; argmax of mean(dim=2) tracks the band for "
        f"{(by_mel // 6 == y).float().mean():.2f} of clips, mean(dim=1) keeps a frame profile "
        f"(argmax = frame {by_time[:3].tolist()}...)")


@fact("ctc_loss_on_raw_logits")
def _():
    logits = torch.randn(10, 1, 4)
    tgt, il, tl = torch.tensor([[1, 2]]), torch.tensor([10]), torch.tensor([2])
    raw = [F.ctc_loss(logits + c, tgt, il, tl).item() for c in (0.0, 2.0)]
    norm = [F.ctc_loss((logits + c).log_softmax(-1), tgt, il, tl).item() for c in (0.0, 2.0)]
    say(f"adding 2 to every logit: raw-logit CTC {raw[0]:.2f} -> {raw[1]:.2f}; log_softmax CTC "
        f"{norm[0]:.2f} -> {norm[1]:.2f} (unchanged)")


@fact("td_target_bootstraps_through_done")
def _():
    s, r, s2, d = T._corridor(300, torch.Generator().manual_seed(0))
    v = torch.zeros(6)
    si, s2i = s.argmax(1), s2.argmax(1)
    for _ in range(300):                                  # tabular fixed point of the unmasked target
        tgt = r + T.GAMMA * v[s2i]
        v = torch.zeros(6).index_add_(0, si, tgt) / torch.bincount(si, minlength=6).clamp(min=1)
    say(f"true V(0..4) = {[round(x, 2) for x in T._true_values().tolist()]}; fixed point without (1 - done) = "
        f"{[round(x, 2) for x in v[:5].tolist()]}")


@fact("t5_decoder_inputs_equal_labels")
def _():
    item = T.Reversal(torch.randint(3, 40, (1, 6), generator=torch.Generator().manual_seed(0)), fixed=False)[0]
    say(f"decoder_input_ids {item['decoder_input_ids'].tolist()} == labels {item['labels'].tolist()}: "
        f"the token to predict at t is the decoder input at t (T5 shifts labels only when decoder_input_ids is None)")


@fact("clip_labels_zeros_on_in_batch_matrix")
def _():
    logits = torch.eye(4) * 10
    say(f"a perfect diagonal (each image with its caption) scores CE {F.cross_entropy(logits, torch.zeros(4).long()):.2f}"
        f" with zeros labels and {F.cross_entropy(logits, torch.arange(4)):.2f} with arange labels")


@fact("listnet_fed_rank_positions")
def _():
    rank = torch.arange(1, 11).float()
    w = F.softmax(rank, 0)
    say(f"softmax(rank) puts {w[-1]:.2f} of the target mass on rank 10 (the worst) and {w[0]:.5f} on rank 1")


@fact("vit_head_swapped_after_optimizer")
def _():
    kw = W.vit_reheaded()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    head = [id(p) in held for p in kw["model"].classifier.parameters()]
    say(f"new classifier parameters in the optimizer: {head}; backbone parameters requiring grad: "
        f"{sum(p.requires_grad for p in kw['model'].vit.parameters())}")


@fact("mape_loss_rewrapped_as_new_tensor")
def _():
    kw = W.mape_rewrapped()
    loss = kw["loss_fn"](kw["model"], next(iter(kw["train_loader"])))
    loss.backward()
    say(f"loss.grad_fn = {loss.grad_fn}, is_leaf = {loss.is_leaf}; parameters with a gradient after backward: "
        f"{sum(p.grad is not None for p in kw['model'].parameters())}")


@fact("item_table_from_pretrained_frozen")
def _():
    say(f"nn.Embedding.from_pretrained(w).weight.requires_grad = "
        f"{nn.Embedding.from_pretrained(torch.randn(3, 2)).weight.requires_grad} (freeze=True by default)")


@fact("vq_codes_without_straight_through")
def _():
    kw = W.vq_no_ste()
    x, y = next(iter(kw["train_loader"]))
    logits, _, _ = kw["model"](x)
    F.cross_entropy(logits, y).backward()
    say(f"gradient of the classification loss reaching the encoder: "
        f"{[p.grad is not None for p in kw['model'].enc.parameters()]}")


@fact("lora_factors_both_zero_init")
def _():
    layer = W.LoRALinear(nn.Linear(4, 3))
    layer(torch.randn(5, 4)).pow(2).sum().backward()
    say(f"A and B both zero: |dA| = {layer.lora_A.grad.abs().sum():.1f}, |dB| = {layer.lora_B.grad.abs().sum():.1f}")


@fact("hf_linear_schedule_sized_in_epochs")
def _():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=5e-3)
    sched = get_linear_schedule_with_warmup(opt, 0, M.EPOCHS)
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    say(f"learning rate over the first 6 of 300 steps: {[f'{x:.1e}' for x in lrs]}")


@fact("model_cast_to_bfloat16_weights")
def _():
    w = torch.tensor(0.1, dtype=torch.bfloat16)
    say(f"in bfloat16, 0.1 + 2e-4 = {(w + 2e-4).item():.6f} and 0.1 = {w.item():.6f}: the update rounds away")


@fact("noam_lambda_times_small_base_lr")
def _():
    lam = M.noam()
    say(f"Noam lambda at step 300 = {lam(300):.2e}; times the optimizer's lr=5e-4 -> {5e-4 * lam(300):.2e}")


@fact("batchnorm_micro_batch_of_one")
def _():
    bn = nn.BatchNorm1d(1)
    sig = torch.sin(torch.arange(64.0) / 3)[None, None]
    quiet, loud = bn(0.5 * sig), bn(2.0 * sig)
    say(f"train-mode BatchNorm on one clip: max |BN(0.5 x) - BN(2 x)| = {(quiet - loud).abs().max():.4f} "
        f"(the level is normalised away)")


@fact("clip_grad_norm_zero_meant_off")
def _():
    p = nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([3.0, 4.0, 0.0])
    torch.nn.utils.clip_grad_norm_([p], 0.0)
    say(f"clip_grad_norm_(params, 0.0) turns the gradient [3, 4, 0] into {p.grad.tolist()}")


@fact("window_zscore_includes_target")
def _():
    xt, yt = D._windows(D._sensor_slices(5, torch.Generator().manual_seed(0)), leak=True)
    say(f"with the target in the statistics, y = -sum(x) exactly: max |y + sum(x)| = {(yt + xt.sum(1)).abs().max():.1e}")


@fact("hf_mask_as_key_padding_mask")
def _():
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    say(f"HF mask {mask.tolist()} as src_key_padding_mask -> {mask.bool().tolist()} (True = ignore): the 3 real "
        f"frames are ignored, the 2 padding frames attended")


@fact("val_features_scaled_with_own_fit")
def _():
    g = torch.Generator().manual_seed(0)
    tr, _ = D._load_rows(-5 + 40 * torch.rand(500, generator=g), g)
    va, _ = D._load_rows(26 + 10 * torch.rand(100, generator=g), g)
    s = D.Scaler()
    s.fit_transform(tr)
    say(f"heat-wave temperature, mean after the training scaler {s.transform(va)[:, 0].mean():.2f}, after its own "
        f"fit {D.Scaler().fit_transform(va)[:, 0].mean():.2f}")


@fact("ner_word_tags_not_aligned_to_pieces")
def _():
    words = torch.tensor([[120, 3, 150]])
    bad, good = D.NerSentences(words, False)[0], D.NerSentences(words, True)[0]
    n = int(good["attention_mask"].sum())
    say(f"tokens {good['input_ids'][:n].tolist()}: unaligned labels {bad['labels'][:n].tolist()}, aligned "
        f"{good['labels'][:n].tolist()}")


@fact("pad_is_eos_labels_mask_eos")
def _():
    ids, mask = D._progressions(200, torch.Generator().manual_seed(0))
    bad = torch.stack([D.Progressions(ids, mask, False)[i]["labels"] for i in range(200)])
    good = torch.stack([D.Progressions(ids, mask, True)[i]["labels"] for i in range(200)])
    say(f"eos targets left in the labels: {(bad == D.EOS).sum().item()} with labels[labels == pad] = -100, "
        f"{(good == D.EOS).sum().item()} when only padding is masked")


for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
