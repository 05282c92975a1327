"""The fact each broken case of set ao rests on, printed by ``verify.py`` before the case is trained next to its fix.
Imported for its side effect: each function is attached to ``FIXES[name]["fact"]``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_ao import cases_data as D
from benchmarks.blind_preflight_ao import cases_mechanics as M
from benchmarks.blind_preflight_ao import cases_targets as T
from benchmarks.blind_preflight_ao import cases_trained as W
from benchmarks.blind_preflight_ao.registry import FIXES, UNK, load_all

load_all()          # every case module registers its fix first


def fact(name):
    def attach(fn):
        FIXES[name]["fact"] = fn
        return fn
    return attach


def show(*parts):
    print("  fact:", *parts)


@fact("shapes_lstm_batch_first_missing")
def _lstm():
    lstm = nn.LSTM(4, 3)
    x = torch.randn(5, 7, 4)                      # (batch=5, seq=7, feat)
    out, _ = lstm(x)
    x2 = x.clone()
    x2[0] += 1.0                                  # change review 0 only
    out2, _ = lstm(x2)
    changed = (out2[:, -1] - out[:, -1]).abs().sum(-1) > 1e-6
    show(f"batch_first={lstm.batch_first}; changing review 0 changes out[:, -1] of reviews {changed.nonzero().flatten().tolist()}")


@fact("shapes_textcnn_view_not_transpose")
def _view():
    e = torch.arange(3 * 4).reshape(1, 3, 4)          # (B=1, T=3, E=4): token t holds 4t..4t+3
    show(f"view(1, 4, 3)[0, 0] = {e.view(1, 4, 3)[0, 0].tolist()} (three dims of token 0), "
         f"transpose(1, 2)[0, 0] = {e.transpose(1, 2)[0, 0].tolist()} (dim 0 of each token)")


@fact("shapes_decoder_steps_stacked_time_major")
def _stack():
    steps = [torch.full((3, 2), t) for t in range(4)]        # 4 steps, batch 3
    flat = torch.stack(steps).reshape(-1, 2)[:, 0][:6].tolist()
    show(f"torch.stack(steps) shape {tuple(torch.stack(steps).shape)}; first 6 flattened rows are steps {flat} "
         f"while tgt.reshape(-1) starts with steps 0,1,2,3 of sequence 0")


@fact("shapes_bilstm_hidden_view")
def _hview():
    h = torch.arange(4).float()[None, :, None].expand(2, 4, 2).contiguous()     # h_n[d, b] filled with b
    rows = h.view(4, -1).tolist()
    show(f"h_n (2 directions, batch=4, 2) filled with each utterance's index; h.view(4, -1) rows: {rows} "
         f"(row b should be all b)")


@fact("shapes_sts_mse_broadcast")
def _bcast():
    show("MSELoss: (24, 1) vs (24,) ->", tuple((torch.zeros(24, 1) - torch.zeros(24)).shape))


@fact("targets_mlm_labels_after_masking")
def _mlm():
    torch.manual_seed(0)
    batch = T.MaskingCollate(False)([r for r in T.doubled_words(4, s=1)])
    masked = batch["labels"][batch["labels"] != -100]
    show(f"labels at masked positions: {masked.unique().tolist()} (the [MASK] id is {T.MASK})")


@fact("targets_gpt2_labels_preshifted")
def _gpt2():
    row = T.lm_rows(T.chain_sequences(1, 6, 40, s=3), fixed=False)[0]
    show(f"input_ids {row['input_ids'].tolist()}, labels {row['labels'].tolist()}; GPT-2 scores logits[:-1] "
         f"against labels[1:] = {row['labels'][1:].tolist()}, i.e. input t -> token t+2")


@fact("targets_decoder_input_not_shifted")
def _shift():
    src, tgt = T.transduction(1, s=1)
    show(f"tgt {tgt[0].tolist()}; decoder input (broken) {tgt[0].tolist()}; "
         f"decoder input (shift_right) {T.shift_right(tgt)[0].tolist()}")


@fact("targets_subword_tags_not_aligned")
def _align():
    xb, yb = T.tagged_subwords(1, s=21, fixed=False)
    xf, yf = T.tagged_subwords(1, s=21, fixed=True)
    n = int((xb[0] != 0).sum())
    show(f"subwords {xb[0, :n].tolist()}\n        labels (broken) {yb[0, :n].tolist()}\n        "
         f"labels (aligned) {yf[0, :n].tolist()}")


@fact("targets_ignore_index_is_o_tag")
def _ignore():
    x, y = T.ner_rows(300, s=22)
    real = x != 0
    show(f"share of real tokens tagged 0 ('O'): {(y[real] == 0).float().mean():.2f}; "
         f"CrossEntropyLoss(ignore_index=0) ignores all of them")


@fact("trained_from_pretrained_frozen_oov")
def _frozen():
    emb = nn.Embedding.from_pretrained(W.glove_like_matrix(80, 4))
    show(f"from_pretrained requires_grad={emb.weight.requires_grad}; keyword rows 4-7 norms "
         f"{emb.weight[4:8].norm(dim=1).tolist()}")


@fact("trained_gru_built_in_forward")
def _inforward():
    m = W.SpamGRU(30, fixed=False)
    x = torch.randint(6, 30, (2, 12))
    a, b = m(x), m(x)
    show(f"registered parameters: {[n for n, _ in m.named_parameters()]}; two calls on the same input differ by "
         f"{(a - b).abs().max():.3f}")


@fact("trained_encoder_under_no_grad")
def _nograd():
    m = W.OrderClassifier(30, fixed=False)
    F.cross_entropy(m(torch.randint(6, 30, (4, 12))), torch.tensor([0, 1, 0, 1])).backward()
    show(f"encoder grads after backward: {[p.grad is not None for p in m.encoder.parameters()]}")


@fact("trained_frozen_random_bert")
def _bert():
    kw = W.frozen_random_bert()
    m = kw["model"]
    show(f"trainable: {[n for n, p in m.named_parameters() if p.requires_grad]} (the model was built from a config)")


@fact("trained_optimizer_encoder_only")
def _opt():
    kw = W.optimizer_encoder_only()
    held = {id(p) for g in kw["optimizer"].param_groups for p in g["params"]}
    show(f"decoder parameters in the optimizer: {sum(id(p) in held for p in kw['model'].decoder.parameters())} "
         f"of {len(list(kw['model'].decoder.parameters()))}")


@fact("mechanics_schedule_total_steps_is_epochs")
def _sched():
    kw = M.schedule_total_steps_is_epochs()
    lrs = []
    for _ in range(6):
        lrs.append(kw["optimizer"].param_groups[0]["lr"])
        kw["optimizer"].step()
        kw["scheduler"].step()
    show(f"lr over the first 6 steps: {[f'{v:.1e}' for v in lrs]}")


@fact("mechanics_sgd_with_finetuning_lr")
def _sgd():
    kw = M.sgd_with_finetuning_lr()
    show(f"optimizer {type(kw['optimizer']).__name__} lr={kw['optimizer'].param_groups[0]['lr']}")


@fact("mechanics_loss_summed_over_tokens")
def _sum():
    kw = M.loss_summed_over_tokens()
    batch = next(iter(kw["train_loader"]))
    s = kw["loss_fn"](kw["model"], batch).item()
    mean = M.TokenCE("mean")(kw["model"], batch).item()
    show(f"summed loss {s:.1f} vs per-token mean {mean:.3f} (x{s / mean:.0f})")


@fact("mechanics_key_padding_mask_inverted")
def _mask():
    ids = torch.tensor([[2, 9, 7, 0, 0]])
    show(f"ids {ids[0].tolist()}: mask passed {(ids != 0)[0].tolist()} (True = ignored by PyTorch attention)")


@fact("mechanics_lm_without_causal_mask")
def _causal():
    m = M.TinyCausalLM(40, causal=False).eval()
    x = torch.randint(4, 40, (1, 8))
    y = x.clone()
    y[0, 5] = (y[0, 5] + 1 - 4) % 36 + 4
    d = (m(x)[0, 2] - m(y)[0, 2]).abs().max().item()
    show(f"changing token 5 changes the logits at position 2 by {d:.3f} (future leaks into the past)")


@fact("data_bucketing_sorts_texts_only")
def _sort():
    docs, y = D.ragged_docs(8, s=51)
    s = sorted(docs, key=len)
    show(f"label of the keyword in each sorted doc {[int(d[(d >= 4) & (d < 8)][0]) - 4 for d in s]} vs labels "
         f"{y.tolist()}")


@fact("data_vocab_lowercased_lookup_cased")
def _case():
    texts, _ = D.support_tickets(50, s=53)
    vocab = D.build_vocab(texts)
    x = D.encode(texts, vocab, lower=False)
    show(f"'Kindle' -> {vocab.get('Kindle', UNK)} (<unk>={UNK}), 'kindle' -> {vocab.get('kindle')}; "
         f"share of <unk> ids in the encoded tickets {(x == UNK).float().mean():.3f}")


@fact("data_stopwords_drop_negation")
def _stop():
    t = [["the", "film", "was", "not", "good"]]
    show(f"{t[0]} -> {[w for w in t[0] if w not in D.STOPWORDS]}")


@fact("data_class_blocks_no_shuffle")
def _blocks():
    kw = D.class_blocks_no_shuffle()
    labels = [b[1].unique().tolist() for _, b in zip(range(40), kw["train_loader"])]
    show(f"classes in the first batches: {labels[:3]} ... {labels[-3:]}")


@fact("data_truncation_max_length_too_short")
def _trunc():
    x, y, _ = D.keyword_texts(400, 48, 60, 4, s=56)
    kept = ((x[:, :8] >= 4) & (x[:, :8] < 8)).any(1).float().mean()
    show(f"share of documents whose deciding token survives max_length=8: {kept:.2f}")
