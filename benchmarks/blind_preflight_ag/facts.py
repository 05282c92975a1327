"""The fact each broken case of set ag rests on, printed by ``verify.py`` before the case is trained next to its fix
(no preflight involved). Importing this module attaches each function to ``FIXES[name]["fact"]``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_ag import (  # noqa: F401  (registers the cases and fixes)
    cases_data,
    cases_healthy,
    cases_mechanics,
    cases_shapes,
    cases_targets,
    cases_trained,
)
from benchmarks.blind_preflight_ag.registry import CASES, FIXES

FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        return fn
    return register


def say(*parts):
    print("  fact:", *parts)


@fact("ag_ctc_log_softmax_over_batch")
def _():
    lp = torch.randn(5, 4, 9).log_softmax(dim=1)
    say(f"(T, B, C) log_softmax(dim=1): sum of probs over classes {lp.exp().sum(-1)[0, 0]:.3f}, "
        f"over the batch {lp.exp().sum(1)[0, 0]:.3f}")


@fact("ag_textcnn_conv_over_embedding_dims")
def _():
    conv = nn.Conv1d(20, 48, 3, padding=1)
    out = conv(torch.randn(2, 20, 32))
    say(f"Conv1d(in_channels=20) on (B, T=20, E=32): output {tuple(out.shape)}, the kernel slides over the 32 "
        "embedding dims; each of the 20 positions is a channel")


@fact("ag_transformer_encoder_not_batch_first")
def _():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0).eval()
    x = torch.randn(4, 6, 16)
    y1 = layer(x)[0]
    x2 = x.clone()
    x2[1:] = torch.randn(3, 6, 16)
    say(f"default layout, changing the OTHER sentences of the batch changes sentence 0's output by "
        f"{(layer(x2)[0] - y1).abs().max():.3f} (attention runs across the batch)")


@fact("ag_ner_logits_reshape_not_transpose")
def _():
    logits = torch.arange(6).view(1, 3, 2)          # (B, T=3, C=2): logits[0, t, c] = 2t + c
    say(f"(1, T=3, C=2) logits {logits[0].tolist()}: reshape(1, 2, 3) -> {logits.reshape(1, 2, 3)[0].tolist()}, "
        f"transpose(1, 2) -> {logits.transpose(1, 2)[0].tolist()}")


@fact("ag_bigru_hidden_view_mixes_batch")
def _():
    gru = nn.GRU(4, 3, batch_first=True, bidirectional=True)
    _, h = gru(torch.randn(5, 7, 4))
    v = h.view(5, -1)
    say(f"h_n {tuple(h.shape)}; h_n.view(5, -1)[0] equals cat(h_n[0][0], h_n[0][1]) (two sentences, forward "
        f"only): {bool(torch.equal(v[0], torch.cat([h[0][0], h[0][1]])))}")


@fact("ag_lm_targets_not_shifted")
def _():
    say("target at position t is input_ids[:, t], which the causal mask lets position t see: a copy task")


@fact("ag_ner_labels_miss_cls_offset")
def _():
    row = cases_targets.ner_features(1, 33, cls_offset=0)
    ids, lab = row["input_ids"][0], row["labels"][0]
    first = ((ids >= cases_targets.FIRST) & (ids < cases_targets.CONT)).nonzero().flatten().tolist()
    say(f"first-piece positions {first[:5]}..., labelled positions {(lab != -100).nonzero().flatten().tolist()[:5]}..."
        " (one to the left; position 0 is [CLS])")


@fact("ag_sts_scores_not_scaled_to_cosine")
def _():
    _, _, score = cases_targets.sts_pairs(1800, 43)
    say(f"{(score > 1).float().mean():.0%} of the gold scores are above 1, the largest cosine similarity")


@fact("ag_ner_ignore_index_is_o_tag")
def _():
    _, tags = cases_shapes.tagged_sentences(1500, 8)
    real = tags != -100
    say(f"{(tags[real] == 0).float().mean():.0%} of the real tokens are tagged O = 0 = ignore_index")


@fact("ag_ctc_blank_is_a_character")
def _():
    say(f"sorted alphabet {cases_targets.ALPHABET}: {cases_targets.ALPHABET[0]!r} gets id 0, the CTC blank")


@fact("ag_embedding_from_pretrained_frozen")
def _():
    emb = nn.Embedding.from_pretrained(torch.randn(5, 3))
    say(f"nn.Embedding.from_pretrained(vectors).weight.requires_grad = {emb.weight.requires_grad}")


@fact("ag_optimizer_holds_discarded_model")
def _():
    kw = CASES["ag_optimizer_holds_discarded_model"].build()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    say(f"parameters of the trained model held by the optimizer: "
        f"{sum(id(p) in held for p in kw['model'].parameters())} of {len(list(kw['model'].parameters()))}")


@fact("ag_padding_idx_is_a_real_word")
def _():
    bag = nn.EmbeddingBag(4, 2, mode="mean", padding_idx=0)
    with_0 = bag(torch.tensor([0, 0, 1, 2]), torch.tensor([0]))
    without = bag(torch.tensor([1, 2]), torch.tensor([0]))
    say(f"EmbeddingBag(padding_idx=0): the bag of [0, 0, 1, 2] equals the bag of [1, 2]: "
        f"{bool(torch.allclose(with_0, without))}; the commonest word ('refund') gets id 0")


@fact("ag_encoder_features_detached")
def _():
    m = cases_trained.GRUClassifier(10, detach_features=True)
    F.cross_entropy(m(torch.randint(1, 10, (4, 5))), torch.tensor([0, 1, 0, 1])).backward()
    say(f"after backward: embedding grad {m.emb.weight.grad}, GRU grad {m.gru.weight_ih_l0.grad}, "
        f"head grad norm {m.head.weight.grad.norm():.3f}")


@fact("ag_gpt2_tied_head_frozen_by_name")
def _():
    kw = CASES["ag_gpt2_tied_head_frozen_by_name"].build()
    m = kw["model"]
    names = [n for n, _ in m.named_parameters()]
    say(f"lm_head.weight is wte.weight: {m.lm_head.weight is m.transformer.wte.weight}; 'lm_head' in "
        f"named_parameters(): {any(n.startswith('lm_head') for n in names)}; lm_head trainable: "
        f"{m.lm_head.weight.requires_grad}; trainable weights {sum(p.numel() for p in m.parameters() if p.requires_grad)}")


@fact("ag_linear_schedule_total_in_epochs")
def _():
    kw = CASES["ag_linear_schedule_total_in_epochs"].build()
    opt, sch, lrs = kw["optimizer"], kw["scheduler"], []
    for step in range(60):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
    say(f"lr at steps 0 / 4 / 8 / 50: {lrs[0]:.1e} / {lrs[4]:.1e} / {lrs[8]:.1e} / {lrs[50]:.1e}")


@fact("ag_warmup_lambda_never_capped")
def _():
    ramp = lambda step: (step + 1) / 10  # noqa: E731
    say(f"lr factor at steps 9 / 100 / 300: {ramp(9):.0f} / {ramp(100):.0f} / {ramp(300):.0f} (base lr 3e-3)")


@fact("ag_lm_missing_causal_mask")
def _():
    torch.manual_seed(0)
    m = cases_mechanics.TinyCausalLM(40, causal=False).eval()
    ids = torch.randint(3, 40, (1, 16))
    ids2 = ids.clone()
    ids2[0, 10] = (ids[0, 10] + 1 - 3) % 37 + 3
    say(f"changing token 10 changes the logits at position 3 by {(m(ids)[0, 3] - m(ids2)[0, 3]).abs().max():.3f} "
        "(position 3 sees the future)")


@fact("ag_key_padding_mask_inverted")
def _():
    ids = torch.tensor([[3, 7, 12, 0, 0]])
    say(f"ids {ids[0].tolist()}: src_key_padding_mask passed {(ids != 0)[0].tolist()} (True = ignore this key)")


@fact("ag_t5_decoder_inputs_are_labels")
def _():
    from transformers import T5Config, T5ForConditionalGeneration
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=40, d_model=8, d_kv=4, d_ff=8, num_layers=1, num_heads=2,
                                             decoder_start_token_id=0, pad_token_id=0))
    labels = torch.tensor([[11, 12, 13, 14]])
    say(f"labels {labels[0].tolist()}; decoder inputs passed {labels[0].tolist()}; what T5 builds itself "
        f"{t5._shift_right(labels)[0].tolist()}")


@fact("ag_val_vocab_rebuilt_on_val_split")
def _():
    from benchmarks.blind_preflight_ag.registry import build_vocab
    texts, _ = cases_trained.polarity_reviews(2000, 161)
    a, b = build_vocab(texts[:1600]), build_vocab(texts[1600:])
    same = sum(a.get(w) == i for w, i in b.items())
    say(f"words whose id agrees between the train and val vocabularies: {same} of {len(b)}")


@fact("ag_pair_truncation_cuts_the_claim")
def _():
    ev, cl, _ = cases_data.claim_pairs(1500, 171)
    cut = sum(len(a) + 3 >= 24 for a in ev) / len(ev)
    say(f"{cut:.0%} of the pairs lose the claim entirely under ids[:24]")


@fact("ag_stopword_list_strips_negation")
def _():
    text = "the food was not good"
    say(f"{text!r} -> {cases_data.clean(text, keep_negations=False)!r}")


@fact("ag_ctc_lengths_wrong_subsampling")
def _():
    _, xl, y, yl = cases_shapes.phone_utterances(1300, 191)
    def need(i):
        p = y[i, : int(yl[i])].tolist()
        return len(p) + sum(a == b for a, b in zip(p, p[1:]))
    bad = sum((int(xl[i]) // 4) < need(i) for i in range(len(xl))) / len(xl)
    ok = sum(((int(xl[i]) + 1) // 2) < need(i) for i in range(len(xl))) / len(xl)
    say(f"utterances impossible to align (loss zeroed by zero_infinity): {bad:.0%} with feat_lens // 4, "
        f"{ok:.0%} with the real (feat_lens + 1) // 2")


@fact("ag_post_padding_last_time_step")
def _():
    kw = CASES["ag_post_padding_last_time_step"].build()
    ids = next(iter(kw["train_loader"]))[0]
    say(f"padding steps after the last word before output[:, -1]: mean {(ids == 0).sum(1).float().mean():.0f} of 64")


for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
