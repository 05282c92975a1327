"""Targets: the labels the loss sees are not the labels the task means (MLM, causal LM, seq2seq, tagging)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ao.registry import PAD, acc_of, case, chain_sequences, fix, fixed_of, gen, loader, seed

MASK = 3


def tiny_bert_config(vocab, **kw):
    from transformers import BertConfig
    return BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=40, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, pad_token_id=PAD, **kw)


# --- 1. MLM labels cloned after the [MASK] substitution ----------------------------------------------------------
def doubled_words(n, s):
    """Reduplicated "words" (each token appears twice in a row, like a stutter corpus): a masked token is
    recoverable from its twin."""
    g = gen(s)
    return torch.randint(4, 40, (n, 8), generator=g).repeat_interleave(2, dim=1)


class MaskingCollate:
    """Masks 30% of the tokens of each batch, BERT style (all to [MASK] here)."""

    def __init__(self, fixed):
        self.fixed = fixed

    def __call__(self, rows):
        ids = torch.stack(rows)
        chosen = torch.rand(ids.shape) < 0.3
        chosen[:, 0] |= ~chosen.any(1)                 # at least one masked token per row
        if self.fixed:
            labels = ids.clone()
            inputs = ids.clone()
            inputs[chosen] = MASK
        else:
            inputs = ids.clone()
            inputs[chosen] = MASK
            labels = inputs.clone()
        labels[~chosen] = -100
        return {"input_ids": inputs, "attention_mask": torch.ones_like(inputs), "labels": labels}


def mlm_val_batches():
    ids = doubled_words(300, s=11)
    g = gen(12)
    chosen = torch.rand(ids.shape, generator=g) < 0.3
    chosen[:, 0] |= ~chosen.any(1)
    inputs = ids.masked_fill(chosen, MASK)
    labels = ids.masked_fill(~chosen, -100)
    return [{"input_ids": inputs[i:i + 100], "attention_mask": torch.ones_like(inputs[i:i + 100]),
             "labels": labels[i:i + 100]} for i in range(0, 300, 100)]


@case("targets_mlm_labels_after_masking", "targets",
      bug="The masked-LM collate copies labels = inputs.clone() after replacing the chosen tokens with [MASK], so the "
          "labels at the masked positions are the [MASK] id itself and the model learns to predict [MASK] instead "
          "of the original token.",
      cause_pattern=r"\[?mask\]? (token|id).{0,60}(label|target)|(label|target)s?.{0,80}\[?mask\]? (token|id)|"
                    r"clone\w*.{0,40}(after|before).{0,30}mask|labels? (are|is|were) (copied|cloned|taken).{0,40}"
                    r"(after|masked)|(predict|recover)\w* (the )?\[?mask\]?( token| id)? (itself|instead)")
def mlm_labels_after_masking(fixed=False):
    seed(0)
    from transformers import BertForMaskedLM
    ids = doubled_words(1200, s=10)
    model = BertForMaskedLM(tiny_bert_config(40))
    collate = MaskingCollate(fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(list(ids), 32, collate_fn=collate),
                val_loader=loader(list(doubled_words(300, s=11)), 100, shuffle=False,
                                  collate_fn=collate),
                max_steps=600)


def _mlm_pred(m, b):
    return m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1), b["labels"]


fix("targets_mlm_labels_after_masking", fixed_of(mlm_labels_after_masking),
    acc_of(_mlm_pred, mlm_val_batches), "masked-token accuracy (original tokens)", steps=300)


# --- 2. GPT-2 labels shifted by hand, then shifted again inside the model -----------------------------------------
def lm_rows(seqs, fixed):
    if fixed:
        return [{"input_ids": s, "labels": s.clone()} for s in seqs]
    return [{"input_ids": s[:-1], "labels": s[1:]} for s in seqs]        # "next-token labels"


def gpt2_model():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1,
                                      eos_token_id=1))


@case("targets_gpt2_labels_preshifted", "targets",
      bug="The causal-LM dataset passes GPT2LMHeadModel labels that are already shifted by one (input_ids[:-1], "
          "labels = ids[1:]), and the model shifts labels again internally, so it is trained to predict the token "
          "two positions ahead.",
      cause_pattern=r"shift\w* (twice|again|two)|double[- ]shift|(already|pre)[- ]?shift|"
                    r"two (positions|tokens|steps) ahead|next[- ]next|labels? ?= ?input_ids|t ?\+ ?2")
def gpt2_labels_preshifted(fixed=False):
    seed(0)
    seqs = chain_sequences(1400, 17, 40, s=13)
    model = gpt2_model()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(lm_rows(seqs[:1100], fixed), 32),
                val_loader=loader(lm_rows(seqs[1100:], fixed), 100, shuffle=False), max_steps=600)


def gpt2_val_batches():
    seqs = chain_sequences(1400, 17, 40, s=13)[1100:]
    return [{"input_ids": seqs[i:i + 100]} for i in range(0, 300, 100)]


def _next_token(m, b):
    ids = b["input_ids"]
    return m(input_ids=ids).logits[:, :-1].argmax(-1), ids[:, 1:]


fix("targets_gpt2_labels_preshifted", fixed_of(gpt2_labels_preshifted), acc_of(_next_token, gpt2_val_batches),
    "val next-token accuracy", steps=300)


# --- 3. seq2seq decoder input not shifted right ---------------------------------------------------------------------
K3, T3 = 6, 10
BOS3 = K3


def transduction(n, s):
    """y_t = (x_t + y_{t-1}) mod K3: each target token depends on the previous one."""
    g = gen(s)
    src = torch.randint(0, K3, (n, T3), generator=g)
    tgt = torch.cumsum(src, 1) % K3
    return src, tgt


class TinySeq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.src_emb = nn.Embedding(K3, 32)
        self.tgt_emb = nn.Embedding(K3 + 1, 32)
        self.pos = nn.Parameter(torch.randn(T3, 32) * 0.1)
        self.core = nn.Transformer(32, 2, 1, 1, 64, dropout=0.0, batch_first=True)
        self.out = nn.Linear(32, K3)

    def forward(self, src, dec_in):
        mask = nn.Transformer.generate_square_subsequent_mask(dec_in.shape[1], device=src.device)
        h = self.core(self.src_emb(src) + self.pos, self.tgt_emb(dec_in) + self.pos, tgt_mask=mask,
                      tgt_is_causal=True)
        return self.out(h)


def s2s_ce(model, batch):
    src, dec_in, tgt = batch
    return F.cross_entropy(model(src, dec_in).reshape(-1, K3), tgt.reshape(-1))


def shift_right(tgt):
    return torch.cat([torch.full_like(tgt[:, :1], BOS3), tgt[:, :-1]], 1)


@case("targets_decoder_input_not_shifted", "targets",
      bug="The translation model is fed the target sequence itself as decoder input (decoder_input = tgt, not "
          "shifted right behind a BOS token), so under the causal mask each position sees the very token it must "
          "predict and learns to copy it.",
      cause_pattern=r"shift\w*[ _-]?(right|tokens_right)|not shifted|unshifted|decoder[_ ]input\w*.{0,60}"
                    r"(same as|equal|identical|=|copy|target|label)|(copy|copies|see|sees|leak)\w*.{0,40}"
                    r"(token|target).{0,30}(predict|itself)|teacher forcing.{0,40}(shift|offset)|\bBOS\b|<s>|start token")
def decoder_input_not_shifted(fixed=False):
    seed(0)
    src, tgt = transduction(1500, s=14)
    dec_in = shift_right(tgt) if fixed else tgt
    model = TinySeq2Seq()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(src[:1200], dec_in[:1200], tgt[:1200]), 32),
                val_loader=loader(TensorDataset(src[1200:], dec_in[1200:], tgt[1200:]), 100, shuffle=False),
                loss_fn=s2s_ce, max_steps=600)


def s2s_val_batches():
    src, tgt = transduction(1500, s=14)
    src, tgt = src[1200:], tgt[1200:]
    return [(src[i:i + 100], shift_right(tgt[i:i + 100]), tgt[i:i + 100]) for i in range(0, 300, 100)]


def _s2s_pred(m, b):
    return m(b[0], b[1]).argmax(-1), b[2]


fix("targets_decoder_input_not_shifted", fixed_of(decoder_input_not_shifted), acc_of(_s2s_pred, s2s_val_batches),
    "val token accuracy, decoder fed the shifted gold prefix", steps=300)


# --- 4. word-level tags laid on subword positions without word_ids alignment ---------------------------------------
N_WORDS, N_TAGS, MAX_SUB = 30, 5, 40


def subword_table():
    g = gen(20)
    pieces, nxt = [], 4
    for _ in range(N_WORDS):
        k = int(torch.randint(1, 4, (1,), generator=g))
        pieces.append(list(range(nxt, nxt + k)))
        nxt += k
    tags = torch.randint(0, N_TAGS, (N_WORDS,), generator=g)
    return pieces, tags, nxt


def tagged_subwords(n, s, fixed):
    pieces, tags, _ = subword_table()
    g = gen(s)
    ids = torch.zeros(n, MAX_SUB, dtype=torch.long)
    labels = torch.full((n, MAX_SUB), -100)
    for i in range(n):
        words = torch.randint(0, N_WORDS, (int(torch.randint(6, 12, (1,), generator=g)),), generator=g).tolist()
        sub, word_ids = [], []
        for j, w in enumerate(words):
            sub += pieces[w]
            word_ids += [j] * len(pieces[w])
        sub, word_ids = sub[:MAX_SUB], word_ids[:MAX_SUB]
        ids[i, :len(sub)] = torch.tensor(sub)
        if fixed:                       # first subword of each word carries the word's tag
            prev = None
            for p, wid in enumerate(word_ids):
                if wid != prev:
                    labels[i, p] = tags[words[wid]]
                prev = wid
        else:                           # tags copied position by position onto the subword sequence
            word_tags = tags[torch.tensor(words)][:len(sub)]
            labels[i, :len(word_tags)] = word_tags
    return ids, labels


class SubwordTagger(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32, padding_idx=PAD)
        self.rnn = nn.GRU(32, 32, batch_first=True, bidirectional=True)
        self.out = nn.Linear(64, N_TAGS)

    def forward(self, ids):
        return self.out(self.rnn(self.emb(ids))[0])


def tag_ce(model, batch):
    ids, labels = batch
    return F.cross_entropy(model(ids).reshape(-1, N_TAGS), labels.reshape(-1), ignore_index=-100)


@case("targets_subword_tags_not_aligned", "targets",
      bug="The POS tagger copies the word-level tags position by position onto the subword token sequence (tag i "
          "on subword i) instead of aligning them with word_ids (tag on each word's first subword, -100 on the "
          "continuation pieces), so after the first split word every label belongs to another word.",
      cause_pattern=r"word_ids|sub-?words?|word[- ]?pieces?|first (sub)?token of (each|the|a) word|"
                    r"continuation (piece|token)s?")
def subword_tags_not_aligned(fixed=False):
    seed(0)
    vocab = subword_table()[2]
    x, y = tagged_subwords(1500, s=21, fixed=fixed)
    model = SubwordTagger(vocab)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=tag_ce, max_steps=500)


def tag_val_batches():
    x, y = tagged_subwords(1500, s=21, fixed=True)
    return [(x[i:i + 100], y[i:i + 100]) for i in range(1200, 1500, 100)]


def _tag_pred(m, b):
    return m(b[0]).argmax(-1), b[1]


fix("targets_subword_tags_not_aligned", fixed_of(subword_tags_not_aligned), acc_of(_tag_pred, tag_val_batches),
    "val tag accuracy on words' first subwords", steps=300)


# --- 5. ignore_index set to the pad label, which is also the "O" tag ------------------------------------------------
N_NER = 5          # O, B-DRUG, I-DRUG, B-DOSE, I-DOSE


def ner_rows(n, s):
    """Clinical-note NER: entity tokens are ids 4-23 (tag by id), the rest "O"; rows padded with id 0, tag 0."""
    g = gen(s)
    lens = torch.randint(8, 25, (n,), generator=g)
    ids = torch.randint(24, 80, (n, 24), generator=g)
    ent = torch.rand(n, 24, generator=g) < 0.3
    ids = torch.where(ent, torch.randint(4, 24, (n, 24), generator=g), ids)
    tags = torch.where(ent, 1 + (ids - 4) % 4, torch.zeros_like(ids))
    pad = torch.arange(24)[None] >= lens[:, None]
    return ids.masked_fill(pad, PAD), tags.masked_fill(pad, 0)


class NERTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(80, 32, padding_idx=PAD)
        self.rnn = nn.GRU(32, 32, batch_first=True, bidirectional=True)
        self.out = nn.Linear(64, N_NER)

    def forward(self, ids):
        return self.out(self.rnn(self.emb(ids))[0])


class NERLoss:
    def __init__(self, fixed):
        self.fixed = fixed
        self.criterion = nn.CrossEntropyLoss() if fixed else nn.CrossEntropyLoss(ignore_index=0)

    def __call__(self, model, batch):
        ids, tags = batch
        if self.fixed:
            tags = tags.masked_fill(ids == PAD, -100)
        return self.criterion(model(ids).reshape(-1, N_NER), tags.reshape(-1))


@case("targets_ignore_index_is_o_tag", "targets",
      bug="The clinical NER loss uses CrossEntropyLoss(ignore_index=0) to skip padding, but tag 0 is also the 'O' "
          "(outside) tag of 70% of the real tokens, so the model never learns 'O' and tags every word as an entity.",
      cause_pattern=r"ignore_index ?= ?0|ignore_index.{0,80}(real|valid|actual|majority|\bO\b|outside|class 0)|"
                    r"(class|tag|label) 0.{0,80}(ignored|never (learn|train)|excluded|pad)|"
                    r"(pad|padding) (label|tag|id).{0,60}(collid|same as|also|real class)")
def ignore_index_is_o_tag(fixed=False):
    seed(0)
    x, y = ner_rows(1500, s=22)
    model = NERTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=NERLoss(fixed), max_steps=500)


def _ner_pred(m, b):
    ids, tags = b
    keep = ids != PAD
    return m(ids).argmax(-1)[keep], tags[keep]


fix("targets_ignore_index_is_o_tag", fixed_of(ignore_index_is_o_tag), acc_of(_ner_pred), "val token accuracy",
    steps=250)
