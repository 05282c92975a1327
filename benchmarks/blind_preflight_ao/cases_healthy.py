"""Healthy: 5 corrected twins of broken cases (the same builder with the one-line fix) and 5 unusual but correct NLP
setups a checker might wrongly flag."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence

from benchmarks.blind_preflight_ao.cases_mechanics import key_padding_mask_inverted, lm_without_causal_mask
from benchmarks.blind_preflight_ao.cases_shapes import bilstm_hidden_view
from benchmarks.blind_preflight_ao.cases_targets import gpt2_labels_preshifted, subword_tags_not_aligned
from benchmarks.blind_preflight_ao.registry import PAD, gen, healthy, keyword_texts, loader, seed, twin

# --- corrected twins -----------------------------------------------------------------------------------------------
healthy("healthy_bilstm_hidden_cat_fixed",
        "Twin of shapes_bilstm_hidden_view: the BiLSTM's h_n[-2] and h_n[-1] concatenated per utterance.")(
    twin(bilstm_hidden_view))
healthy("healthy_gpt2_labels_are_input_ids_fixed",
        "Twin of targets_gpt2_labels_preshifted: GPT2LMHeadModel given labels = input_ids (it shifts them).")(
    twin(gpt2_labels_preshifted))
healthy("healthy_subword_tags_word_ids_fixed",
        "Twin of targets_subword_tags_not_aligned: tags on each word's first subword, -100 on continuation pieces "
        "and padding.")(twin(subword_tags_not_aligned))
healthy("healthy_key_padding_mask_true_on_pad_fixed",
        "Twin of mechanics_key_padding_mask_inverted: src_key_padding_mask = (ids == pad).")(
    twin(key_padding_mask_inverted))
healthy("healthy_lm_causal_mask_fixed",
        "Twin of mechanics_lm_without_causal_mask: the decoder-only LM with a square subsequent (causal) mask.")(
    twin(lm_without_causal_mask))


# --- unusual but correct -------------------------------------------------------------------------------------------
def reversal_rows(n, s, eos, ignore=-100, max_len=10, reverse=True):
    """Variable-length reversal (or copy): source 4-10 tokens (ids 4-29), target = reversed (or the same) source +
    EOS, padded."""
    g = gen(s)
    rows = []
    for _ in range(n):
        k = int(torch.randint(4, max_len + 1, (1,), generator=g))
        src = torch.randint(4, 30, (k,), generator=g)
        rows.append((src, torch.cat([src.flip(0) if reverse else src, torch.tensor([eos])])))
    src = pad_sequence([r[0] for r in rows], batch_first=True, padding_value=PAD)
    src = F.pad(src, (0, max_len - src.shape[1]), value=PAD)
    tgt = pad_sequence([r[1] for r in rows], batch_first=True, padding_value=ignore)
    tgt = F.pad(tgt, (0, max_len + 1 - tgt.shape[1]), value=ignore)
    return [{"input_ids": a, "attention_mask": (a != PAD).long(), "labels": b} for a, b in zip(src, tgt)]


@healthy("healthy_bart_from_config_copy",
         "A tiny BartForConditionalGeneration built from a config (no download) on variable-length copying: labels "
         "padded with -100 (the model builds decoder_input_ids by shift_tokens_right), bf16, clipping at 1.0 and a "
         "linear warm-up schedule sized to max_steps.")
def bart_from_config_copy():
    seed(0)
    from transformers import BartConfig, BartForConditionalGeneration, get_linear_schedule_with_warmup
    config = BartConfig(vocab_size=32, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
                        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=PAD,
                        bos_token_id=2, eos_token_id=3, decoder_start_token_id=2, forced_eos_token_id=3)
    model = BartForConditionalGeneration(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=20, num_training_steps=400)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(reversal_rows(1200, 61, eos=3, reverse=False), 32),
                val_loader=loader(reversal_rows(200, 62, eos=3, reverse=False), 100, shuffle=False),
                precision="bf16", clip_grad_norm=1.0, max_steps=400)


class TiedLSTMLM(nn.Module):
    """Word-level LSTM LM with tied input/output embeddings, run on packed variable-length sentences."""

    def __init__(self, vocab):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32, padding_idx=PAD)
        self.lstm = nn.LSTM(32, 32, batch_first=True)
        self.decoder = nn.Linear(32, vocab)
        self.decoder.weight = self.emb.weight               # weight tying (Press & Wolf)

    def forward(self, ids, lengths):
        packed = pack_padded_sequence(self.emb(ids), lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=ids.shape[1])
        return self.decoder(out)


def lm_collate(rows):
    ids = pad_sequence(rows, batch_first=True, padding_value=PAD)
    return ids, torch.tensor([len(r) - 1 for r in rows])


def packed_lm_loss(model, batch):
    ids, lengths = batch
    logits = model(ids[:, :-1], lengths)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), ignore_index=PAD)


def ragged_progressions(n, s):
    g = gen(s)
    out = []
    for _ in range(n):
        k = int(torch.randint(5, 17, (1,), generator=g))
        start, step = int(torch.randint(0, 36, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        out.append((start + step * torch.arange(k)) % 36 + 4)
    return out


@healthy("healthy_tied_lstm_lm_packed",
         "An LSTM language model whose output layer shares the embedding matrix (weight tying: one Parameter in two "
         "modules) on packed variable-length sentences (lengths kept on the CPU), loss with ignore_index=pad.")
def tied_lstm_lm_packed():
    seed(0)
    model = TiedLSTMLM(40)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(ragged_progressions(1200, 63), 32, collate_fn=lm_collate),
                val_loader=loader(ragged_progressions(200, 64), 100, shuffle=False, collate_fn=lm_collate),
                loss_fn=packed_lm_loss, max_steps=500)


@healthy("healthy_t5_adafactor_accumulation",
         "A tiny T5ForConditionalGeneration from a config on a padded reversal task with -100 labels, trained with "
         "transformers' Adafactor at a fixed lr (relative_step=False, scale_parameter=False, warmup_init=False) and "
         "2-step gradient accumulation.")
def t5_adafactor_accumulation():
    seed(0)
    from transformers import T5Config, T5ForConditionalGeneration
    from transformers.optimization import Adafactor
    config = T5Config(vocab_size=32, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2,
                      dropout_rate=0.0, pad_token_id=PAD, eos_token_id=1, decoder_start_token_id=PAD)
    model = T5ForConditionalGeneration(config)
    optimizer = Adafactor(model.parameters(), lr=1e-2, relative_step=False, scale_parameter=False,
                          warmup_init=False)
    return dict(model=model, optimizer=optimizer, train_loader=loader(reversal_rows(1200, 65, eos=1), 16),
                val_loader=loader(reversal_rows(200, 66, eos=1), 100, shuffle=False), accumulation_steps=2,
                max_steps=300)


class FrozenVectorsAttention(nn.Module):
    """Frozen, informative "pretrained" word vectors (freeze=True on purpose), a trainable BiGRU and masked
    additive attention pooling."""

    def __init__(self, vectors, n_classes):
        super().__init__()
        self.emb = nn.Embedding.from_pretrained(vectors, freeze=True, padding_idx=PAD)
        self.rnn = nn.GRU(vectors.shape[1], 32, batch_first=True, bidirectional=True)
        self.score = nn.Linear(64, 1)
        self.head = nn.Linear(64, n_classes)

    def forward(self, ids):
        h = self.rnn(self.emb(ids))[0]
        scores = self.score(h).squeeze(-1).masked_fill(ids == PAD, float("-inf"))
        weights = torch.softmax(scores, dim=1).unsqueeze(-1)
        return self.head((weights * h).sum(1))


@healthy("healthy_frozen_vectors_bigru_attention",
         "Intentionally frozen pretrained word vectors (every row informative) under a trainable BiGRU with "
         "masked attention pooling; the optimizer holds only the trainable parameters.")
def frozen_vectors_bigru_attention():
    seed(0)
    x, y, _ = keyword_texts(1600, 20, 60, 4, s=67, lengths=(6, 20))
    vectors = torch.randn(60, 32, generator=gen(68))
    vectors[PAD] = 0.0
    model = FrozenVectorsAttention(vectors, 4)
    params = [p for p in model.parameters() if p.requires_grad]
    from torch.utils.data import TensorDataset
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


class FastTextBag(nn.Module):
    def __init__(self, vocab, n_classes):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, 32, mode="mean")
        self.head = nn.Linear(32, n_classes)

    def forward(self, flat, offsets):
        return self.head(self.bag(flat, offsets))


def offsets_collate(rows):
    texts, labels = zip(*rows)
    offsets = torch.tensor([0] + [len(t) for t in texts[:-1]]).cumsum(0)
    return torch.cat(texts), offsets, torch.stack(labels)


def smoothed_ce(model, batch):
    flat, offsets, y = batch
    return F.cross_entropy(model(flat, offsets), y, label_smoothing=0.1)


@healthy("healthy_embeddingbag_offsets_onecycle",
         "A fastText-style nn.EmbeddingBag over flat token ids with offsets (no padding at all), two AdamW groups "
         "(no weight decay on the embedding table), OneCycleLR sized to max_steps and label smoothing 0.1.")
def embeddingbag_offsets_onecycle():
    seed(0)
    x, y, lens = keyword_texts(1600, 24, 80, 5, s=69, lengths=(5, 24))
    rows = [(row[:int(k)], t) for row, k, t in zip(x, lens, y)]
    model = FastTextBag(80, 5)
    optimizer = torch.optim.AdamW([{"params": model.bag.parameters(), "weight_decay": 0.0},
                                   {"params": model.head.parameters(), "weight_decay": 0.01}], lr=1e-2)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=2e-2, total_steps=400)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(rows[:1200], 32, collate_fn=offsets_collate),
                val_loader=loader(rows[1200:], 100, shuffle=False, collate_fn=offsets_collate),
                loss_fn=smoothed_ce, max_steps=400)
