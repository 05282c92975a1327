"""The fact each broken case of set x rests on, printed by ``verify.py`` before the case is trained next to its fix
(imported for its side effect: it attaches a ``fact`` function to each entry of ``FIXES``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_x import (
    cases_data,
    cases_mechanics,
    cases_shapes,
    cases_targets,
    cases_trained,
)
from benchmarks.blind_preflight_x.registry import FIXES


def fact(name):
    def attach(fn):
        FIXES[name]["fact"] = fn
        return fn
    return attach


@fact("sh_textcnn_conv1d_slides_over_embedding")
def _():
    conv = cases_shapes.TextCNN(False).conv
    print(f"  fact: Conv1d weight {tuple(conv.weight.shape)}: in_channels={conv.in_channels} = seq_len, the kernel "
          f"slides along the last dim (embedding, 16) of a (batch, 20, 16) input")


@fact("sh_packed_gru_takes_padded_last_step")
def _():
    x, _ = cases_shapes._sessions(32, 2)
    model = cases_shapes.SessionGRU(False)
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    lengths = (x != 0).sum(1)
    out, _ = model.gru(pack_padded_sequence(model.emb(x), lengths, batch_first=True, enforce_sorted=False))
    out, _ = pad_packed_sequence(out, batch_first=True)
    zero = (out[:, -1].abs().sum(1) == 0).float().mean().item()
    print(f"  fact: out[:, -1] is all zeros for {zero:.0%} of a batch (lengths {lengths.min()}..{lengths.max()})")


@fact("sh_tagger_seq_first_tags_flattened")
def _():
    words, tags = cases_shapes.seq_first_collate(list(zip(*cases_shapes._pos_sentences(32, 3))))
    agree = (tags.reshape(-1) == (words % 6).reshape(-1)).float().mean().item()
    print(f"  fact: words {tuple(words.shape)}, tags {tuple(tags.shape)}; flattened, the tag at each flat index "
          f"matches that index's word {agree:.0%} of the time")


@fact("sh_mha_default_seq_first_fed_batch_first")
def _():
    attn = nn.MultiheadAttention(32, 4)
    _, w = attn(*(torch.randn(8, 10, 32),) * 3)
    print(f"  fact: batch_first={attn.batch_first}; attention weights on a (batch=8, seq=10) input have shape "
          f"{tuple(w.shape)}: (seq=10, 8 x 8) over the batch axis")


@fact("sh_pinball_loss_broadcasts_batch_by_batch")
def _():
    print(f"  fact: y (32,) - pred (32, 1) -> {tuple((torch.zeros(32) - torch.zeros(32, 1)).shape)}")


@fact("tg_t5_decoder_input_ids_equal_labels")
def _():
    model = cases_targets.tiny_t5()
    labels = torch.tensor([[5, 6, 7, 8]])
    print(f"  fact: labels {labels.tolist()}; model._shift_right(labels) = {model._shift_right(labels).tolist()}; "
          f"the broken batches pass decoder_input_ids = labels unshifted")


@fact("tg_class_weights_in_value_counts_order")
def _():
    _, y = cases_targets._intents(3000, 22)
    bad, good = cases_targets.intent_weights(y[:2400], False), cases_targets.intent_weights(y[:2400], True)
    print(f"  fact: counts by id {torch.bincount(y[:2400]).tolist()} ({cases_targets.INTENTS}); weight passed "
          f"{[round(v, 2) for v in bad.tolist()]} vs by id {[round(v, 2) for v in good.tolist()]}")


@fact("tg_sigmoid_head_on_price_regression")
def _():
    _, y = cases_targets._prices(1800, 23)
    print(f"  fact: targets span {y.min():.0f}..{y.max():.0f}; nn.Sigmoid outputs lie in (0, 1)")


@fact("tg_bert_num_labels_one_for_four_classes")
def _():
    model = cases_targets.tiny_bert_classifier(1)
    print(f"  fact: num_labels=1 -> classifier {tuple(model.classifier.weight.shape)}, problem_type inferred as "
          f"regression (MSELoss); argmax over one logit is always 0")


@fact("tg_focal_loss_uses_p_not_p_t")
def _():
    p = torch.tensor([0.05, 0.95])
    print(f"  fact: for a negative, broken weight (1 - p)^2 at p = 0.05 / 0.95: {((1 - p) ** 2).tolist()} "
          f"(the confident false alarm gets 0.0025), correct (1 - p_t)^2: {(p ** 2).tolist()}")


@fact("wt_multitask_main_head_on_detached_encoder")
def _():
    model = cases_trained.TopicAndLength(False)
    x, topic, length = cases_trained._topic_docs(32, 31)
    t, _ = model(x)
    F.cross_entropy(t, topic).backward()
    g = sum(p.grad.abs().sum().item() for p in model.shared.parameters() if p.grad is not None)
    print(f"  fact: gradient of the topic loss on the shared layers: {g:.3g}")


@fact("wt_projection_layer_built_in_forward")
def _():
    model = cases_trained.PairClassifier(False)
    x = torch.randn(4, 24)
    print(f"  fact: parameters in the model: {[n for n, _ in model.named_parameters()]}; two calls on the same input "
          f"agree: {torch.allclose(model(x), model(x))}")


@fact("wt_hash_bits_hard_threshold_no_ste")
def _():
    s = torch.randn(5, requires_grad=True)
    print(f"  fact: (s > 0).float().requires_grad = {(s > 0).float().requires_grad}: no gradient reaches the encoder")


@fact("wt_encoder_called_under_no_grad")
def _():
    model = cases_trained.FrozenByAccident(False)
    x, _ = cases_trained._order_docs(8, 34)
    with torch.no_grad():
        h = model.encode(x)
    print(f"  fact: encoder output under torch.no_grad(): requires_grad={h.requires_grad}, grad_fn={h.grad_fn}")


@fact("wt_most_frequent_word_is_padding_idx")
def _():
    docs, _ = cases_trained._reviews_text(1800, 35)
    vocab = cases_trained.build_vocab(docs, False)
    first = min(vocab, key=vocab.get)
    print(f"  fact: vocab[{first!r}] = {vocab[first]} = padding_idx = the pad value")


@fact("mx_warmup_lambda_never_caps")
def _():
    lam = cases_mechanics.warmup(False)
    print(f"  fact: LR factor at steps 0, 4, 50, 299: {[lam(s) for s in (0, 4, 50, 299)]}")


@fact("mx_custom_function_backward_ignores_grad_output")
def _():
    x = torch.randn(6, dtype=torch.double, requires_grad=True)
    (cases_mechanics.Softsign.apply(x, False) * 100).sum().backward()
    ref = 100 / (1 + x.detach().abs()) ** 2
    print(f"  fact: d(100 * softsign(x))/dx from the Function {x.grad[:3].tolist()} vs true {ref[:3].tolist()}")


@fact("mx_dropout_given_tf_keep_prob")
def _():
    d = nn.Dropout(cases_mechanics.KEEP_PROB)
    print(f"  fact: nn.Dropout({d.p}) zeroes {(d(torch.ones(10000)) == 0).float().mean():.0%} of the activations")


@fact("mx_custom_dense_constant_init")
def _():
    layer = cases_mechanics.Dense(16, 64, False)
    print(f"  fact: distinct rows in the first layer's weight: {torch.unique(layer.weight, dim=0).shape[0]} of 64")


@fact("mx_token_loss_summed_with_sgd_lr_for_mean")
def _():
    logits, y = torch.randn(512, 3), torch.randint(0, 3, (512,))
    ratio = F.cross_entropy(logits, y, reduction="sum") / F.cross_entropy(logits, y)
    print(f"  fact: sum / mean over a 32 x 16 batch = {ratio:.0f}")


@fact("dt_ner_tag_vocab_built_per_split")
def _():
    _, tags = cases_data._ner_sentences(1500, 51)
    print(f"  fact: train label2id {cases_data.tag_vocab(tags[:1200])}; val label2id "
          f"{cases_data.tag_vocab(tags[1200:][::-1])}")


@fact("dt_word_labels_not_shifted_for_cls")
def _():
    row = cases_data._slot_rows(1, 52, aligned=False)[0]
    print(f"  fact: input_ids {row['input_ids'][:5].tolist()}..., labels {row['labels'][:5].tolist()}... "
          f"([CLS] = 1 carries word 1's tag)")


@fact("dt_attention_mask_is_padding_mask")
def _():
    x, y = cases_data._complaints(4, 54)
    row = cases_data.complaint_rows(x, y, False)[0]
    print(f"  fact: input_ids {row['input_ids'].tolist()}\n        attention_mask {row['attention_mask'].tolist()}")


@fact("dt_sampler_weights_are_class_frequency")
def _():
    kw = cases_data.dt_sampler()
    seen = torch.cat([b[1] for b in kw["train_loader"]])
    print(f"  fact: class counts drawn in one epoch {torch.bincount(seen, minlength=3).tolist()} "
          f"(dataset {torch.bincount(kw['train_loader'].dataset.tensors[1], minlength=3).tolist()})")


@fact("dt_dropna_features_only_labels_shifted")
def _():
    x, y = cases_data._meters(2600, 56)
    xc, yc = cases_data.clean(x[:2200], y[:2200], False)
    xf, yf = cases_data.clean(x[:2200], y[:2200], True)
    print(f"  fact: {len(x[:2200]) - len(xc)} rows dropped; rows whose target is still their own: "
          f"{(yc == yf).float().mean():.0%}")
