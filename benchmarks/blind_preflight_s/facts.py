"""The fact each broken case of set s rests on, printed by ``verify.py`` before the case is trained next to its fix
(no preflight involved). Importing this module attaches each function to ``FIXES[name]["fact"]``."""

from __future__ import annotations

import importlib

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_s.registry import FIXES, load_all

load_all()  # registers the cases (and their fixes) in family order before the facts attach to them


def _family(module: str):
    return importlib.import_module(f"benchmarks.blind_preflight_s.{module}")


cs, ct, cw = _family("cases_shapes"), _family("cases_targets"), _family("cases_trained")
cm, cd = _family("cases_mechanics"), _family("cases_data")


def fact(name):
    def attach(fn):
        FIXES[name]["fact"] = fn
        return fn
    return attach


@fact("vibration_transformer_default_seq_first")
def _():
    x, _ = cs.vibration_windows(8, 1)
    for batch_first in (False, True):
        torch.manual_seed(0)
        m = cs.VibrationTransformer(batch_first=batch_first).eval()
        x2 = x.clone()
        x2[1] += 5.0                            # change window 1 only
        with torch.no_grad():
            d = (m(x) - m(x2))[0].abs().max().item()
        print(f"  batch_first={batch_first}: changing window 1 moves window 0's logits by {d:.3g}")


@fact("intent_bilstm_hidden_view")
def _():
    m = cs.IntentBiLSTM()
    x, _ = cs.intent_utterances(4, 3)
    _, (h, _) = m.lstm(m.emb(x))
    row0 = h.view(4, -1)[0]
    print(f"  h_n {tuple(h.shape)}; view(4, -1)[0] == cat(h_n[0, 0], h_n[0, 1]) (forward states of utterances 0 and 1):",
          torch.equal(row0, torch.cat([h[0, 0], h[0, 1]])))


@fact("ecg_leads_reshape_not_transpose")
def _():
    x, _ = cs.ecg_lead_windows(1, 5)
    r = x.reshape(1, 40, 6)[0, 0]
    print("  reshape(b, samples, leads)[0, 0] == lead 0's first 6 samples:", torch.equal(r, x[0, 0, :6]),
          "| transpose(1, 2)[0, 0] == the 6 leads at sample 0:", torch.equal(x.transpose(1, 2)[0, 0], x[0, :, 0]))


@fact("tagger_seq_first_logits_flattened")
def _():
    m = cs.SeqFirstTagger()
    x, y = cs.tagged_sentences(32, 7)
    out = m(x)
    print(f"  logits {tuple(out.shape)} (time, batch, tags) vs tags {tuple(y.shape)}: flattened row 1 is (t=0, b=1) but "
          "tag row 1 is (b=0, t=1)")


@fact("repurchase_attention_softmax_size1_dim")
def _():
    scores = torch.randn(2, 8, 1)
    print("  softmax over dim=-1 of (batch, history, 1) scores:", torch.softmax(scores, -1)[0, :, 0].tolist())


@fact("reversal_decoder_fed_unshifted_targets")
def _():
    _, tgt = ct.reversal_pairs(1, 11)
    print("  decoder input", tgt[0].tolist(), "== labels", tgt[0].tolist(), "(the shifted input would be",
          [ct.BOS] + tgt[0, :-1].tolist(), ")")


@fact("ner_ignore_index_zero_is_outside_tag")
def _():
    _, tags = ct.ner_sentences(1600, 13)
    print(f"  {100 * (tags == 0).float().mean():.0f}% of tokens carry tag 0 ('O'), all ignored by ignore_index=0")


@fact("phone_ctc_blank_collides_with_symbol")
def _():
    _, labels = ct.ctc_utterances(1600, 15)
    print(f"  {100 * (labels == 0).any(1).float().mean():.0f}% of transcripts contain symbol 0 = F.ctc_loss's default "
          "blank; output 8 is never a target")


@fact("demand_forecast_target_is_window_start")
def _():
    x, y = ct.demand_windows(ct.demand_series(2800, 17)[:2200], fixed=False)
    print("  target == x[:, 0] (first value of its own window):", torch.equal(y[:, 0], x[:, 0]))


@fact("ticket_priority_class_weights_are_frequencies")
def _():
    _, y = ct.ticket_features(3200, 19)
    freq = torch.bincount(y, minlength=4).float() / len(y)
    print("  weights passed:", [round(v, 3) for v in freq.tolist()], "| inverse-frequency weights:",
          [round(v, 2) for v in (1 / (4 * freq)).tolist()])


@fact("tone_head_replaced_after_optimizer")
def _():
    kw = cw.tone_head_replaced_after_optimizer()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    trainable = [n for n, p in kw["model"].named_parameters() if p.requires_grad]
    print("  trainable parameters:", trainable, "| in the optimizer:",
          [n for n, p in kw["model"].named_parameters() if id(p) in held and p.requires_grad])


@fact("ratings_mf_factors_plain_tensors")
def _():
    m = cw.MatrixFactorization()
    print("  model.parameters():", [n for n, _ in m.named_parameters()], "| P.requires_grad:", m.P.requires_grad)


@fact("review_bert_encoder_under_no_grad")
def _():
    m = cw.ReviewClassifier()
    x, y = cw.polar_reviews(8, 25)
    F.cross_entropy(m(x), y).backward()
    print("  encoder grads after backward:", {p.grad is None for p in m.encoder.parameters()} == {True},
          "(all None) | head grad set:", m.head.weight.grad is not None)


@fact("waveform_encoder_reentrant_checkpoint")
def _():
    m = cw.CheckpointedConvNet(use_reentrant=True)
    x, y = cw.waveform_shapes(8, 27)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        F.cross_entropy(m(x), y).backward()
    print("  encoder conv weight grad after backward:", m.encoder[0].weight.grad, "| head grad set:",
          m.head.weight.grad is not None)


@fact("ticket_router_pretrained_embeddings_frozen")
def _():
    m = cw.TicketRouter()
    print("  emb.weight.requires_grad:", m.emb.weight.requires_grad, "| product-code rows all zero:",
          bool((m.emb.weight[cw.GENERAL:] == 0).all()))


@fact("topic_gpt2_schedule_counts_epochs")
def _():
    kw = cm.topic_gpt2_schedule_counts_epochs()
    lrs = []
    for _ in range(6):
        lrs.append(kw["optimizer"].param_groups[0]["lr"])
        kw["optimizer"].step()
        kw["scheduler"].step()
    print("  LR over the first 6 steps:", [f"{v:.2g}" for v in lrs], f"of {kw['max_steps']}")


@fact("accent_finetune_checkpoint_prefix_strict_false")
def _():
    m = cm.AccentMLP()
    res = m.load_state_dict(cm.dataparallel_checkpoint()["state_dict"], strict=False)
    print(f"  load_state_dict(strict=False): {len(res.missing_keys)} missing, {len(res.unexpected_keys)} unexpected, "
          f"0 loaded ({res.unexpected_keys[0]!r} vs {res.missing_keys[0]!r})")


@fact("stars_loss_rounds_predictions")
def _():
    kw = cm.stars_loss_rounds_predictions()
    batch = next(iter(kw["train_loader"]))
    kw["loss_fn"](kw["model"], batch).backward()
    print("  largest |grad| over all weights:", max(p.grad.abs().max().item() for p in kw["model"].parameters()))


@fact("load_mlp_pure_bf16_weights")
def _():
    w = torch.tensor([0.01, 0.05, 0.1, 0.2], dtype=torch.bfloat16)
    print("  bf16 w + 2e-4 == w for w =", w.tolist(), ":", ((w + 2e-4) == w).tolist())


@fact("char_lm_clip_grad_norm_zero")
def _():
    lin = nn.Linear(3, 1)
    lin(torch.randn(4, 3)).sum().backward()
    torch.nn.utils.clip_grad_norm_(lin.parameters(), 0.0)
    print("  after clip_grad_norm_(params, 0.0): grad =", lin.weight.grad.tolist())


@fact("ticket_padding_mask_inverted")
def _():
    tokens, mask, _ = cd.ticket_collate(False)([(torch.tensor([1, 7, 3]), torch.tensor(1))])
    print("  tokens", tokens[0, :5].tolist(), "src_key_padding_mask", mask[0, :5].tolist(),
          "(True = ignore: the real tokens are the ignored ones)")


@fact("log_sessions_truncated_to_head")
def _():
    seqs, _ = cd.log_sessions(2000, 63)
    print(f"  {100 * np.mean([len(s) > cd.TRUNC for s in seqs]):.0f}% of sessions are longer than {cd.TRUNC}; the "
          "label token is always the last event")


@fact("clickstream_sorted_export_small_shuffle_buffer")
def _():
    x, y = cd.clickstream_rows(1200, 66)
    batches = torch.utils.data.DataLoader(cd.BufferedStream(x, y, 16), batch_size=32)
    classes = [sorted(set(b[1].tolist())) for _, b in zip(range(150), batches)]
    print("  classes in batches 0, 40, 80, 149:", classes[0], classes[40], classes[80], classes[149])


@fact("store_sales_codes_encoded_per_split")
def _():
    tr, va = cd.store_sales(3000, 69), cd.store_sales(800, 70, closed=cd.CLOSED)
    name = "store_20"
    t_code = cd.store_codes(tr[0])[list(tr[0]).index(name)]
    v_code = cd.store_codes(va[0])[list(va[0]).index(name)]
    print(f"  {name}: id {t_code} in training, id {v_code} in validation")


@fact("meter_days_normalised_per_sample")
def _():
    x, y = cd.meter_days(1600, 71)
    print("  mean kWh per type:", [round(x[y == k].mean().item(), 2) for k in range(4)],
          "| after per-day z-scoring every day has mean 0, std 1")
