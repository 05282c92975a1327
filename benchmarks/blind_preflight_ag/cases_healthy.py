"""Set ag, healthy setups: 5 corrected twins of broken cases (the same builder with the one-line fix) and 5 unusual
but correct sequence-model setups. None may raise a warning or an error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.data import TensorDataset
from transformers import BertForMaskedLM, GPT2LMHeadModel, get_cosine_schedule_with_warmup

from benchmarks.blind_preflight_ag.cases_data import ag_ctc_lengths_wrong_subsampling
from benchmarks.blind_preflight_ag.cases_mechanics import (
    ag_key_padding_mask_inverted,
    ag_linear_schedule_total_in_epochs,
    reversal_pairs,
)
from benchmarks.blind_preflight_ag.cases_shapes import AcousticModel, ag_bigru_hidden_view_mixes_batch
from benchmarks.blind_preflight_ag.cases_targets import (
    ALPHABET,
    CLS,
    CONT,
    SEP,
    DictDataset,
    TagCE,
    ag_ner_labels_miss_cls_offset,
    bert_config,
    ner_features,
    stroke_lines,
)
from benchmarks.blind_preflight_ag.cases_trained import gpt2_config
from benchmarks.blind_preflight_ag.registry import gen, healthy, loader, markov_text, seed, twin

# ---------------------------------------------------------------------------------------------- corrected twins

healthy("ag_h_bigru_hidden_directions_concatenated",
        "Twin of ag_bigru_hidden_view_mixes_batch: the BiGRU classifier's features are "
        "torch.cat([h_n[0], h_n[1]], dim=1), each sentence's own forward and backward states.")(
    twin(ag_bigru_hidden_view_mixes_batch))

healthy("ag_h_bert_ner_labels_after_cls",
        "Twin of ag_ner_labels_miss_cls_offset: a BERT token classifier from config whose word tags sit on the first "
        "sub-word piece, offset by one for [CLS], -100 on [CLS], [SEP], '##' pieces and padding.")(
    twin(ag_ner_labels_miss_cls_offset))

healthy("ag_h_key_padding_mask_true_on_pads",
        "Twin of ag_key_padding_mask_inverted: a padded intent Transformer with src_key_padding_mask=(ids == PAD) "
        "and a masked mean over the real tokens.")(twin(ag_key_padding_mask_inverted))

healthy("ag_h_ctc_lengths_from_conv_stride",
        "Twin of ag_ctc_lengths_wrong_subsampling: a stride-2 Conv1d + BiGRU CTC phone recogniser whose input "
        "lengths are (feat_lens + 1) // 2, the conv's own output length, with CTCLoss(zero_infinity=True).")(
    twin(ag_ctc_lengths_wrong_subsampling))

healthy("ag_h_linear_schedule_in_optimizer_steps",
        "Twin of ag_linear_schedule_total_in_epochs: DistilBERT from config with get_linear_schedule_with_warmup over "
        "EPOCHS * len(train_loader) optimizer steps (6% warm-up), stepped every batch, max_steps equal to it.")(
    twin(ag_linear_schedule_total_in_epochs))


# ---------------------------------------------------------------------------------------------- unusual but correct

@healthy("ag_h_gpt2_padded_cosine_warmup",
         "A tiny GPT-2 from config on right-padded variable-length text: pad id 0 with attention_mask, labels = "
         "input_ids with -100 on padding (the model shifts them itself), tied embeddings, AdamW with no weight decay "
         "on biases and LayerNorms, a cosine schedule with 30 warm-up steps over max_steps, clipping at 1.0.")
def ag_h_gpt2_padded_cosine_warmup():
    seed(0)
    model = GPT2LMHeadModel(gpt2_config(pad_token_id=0))
    text = markov_text(1800, 20, 40, s=211)
    g = gen(212)
    lens = torch.randint(8, 21, (1800,), generator=g)
    keep = torch.arange(20) < lens[:, None]
    ids = text.masked_fill(~keep, 0)
    labels = ids.masked_fill(~keep, -100)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-3)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=30, num_training_steps=300)
    rows = dict(input_ids=ids, attention_mask=keep.long(), labels=labels)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(DictDataset(**{k: v[:1500] for k, v in rows.items()}), 32),
                val_loader=loader(DictDataset(**{k: v[1500:] for k, v in rows.items()}), 100, shuffle=False),
                loss_fn=None, max_steps=300, clip_grad_norm=1.0)


@healthy("ag_h_crnn_ctc_blank_last",
         "A CTC handwriting recogniser with the blank as the last class (blank=len(alphabet), characters 0..6, the "
         "space included), log_softmax over the classes of the (T, B, C) tensor, per-line frame and character "
         "lengths, default zero_infinity=False.")
def ag_h_crnn_ctc_blank_last():
    seed(0)
    x, xl, y, yl = stroke_lines(1000, 221)
    blank = len(ALPHABET)

    def ctc(model, batch):
        feats, feat_lens, chars, char_lens = batch
        log_probs = model(feats).log_softmax(dim=-1).transpose(0, 1)
        return F.ctc_loss(log_probs, chars, feat_lens, char_lens, blank=blank)

    model = AcousticModel(len(ALPHABET) + 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:800], xl[:800], y[:800], yl[:800]), 32),
                val_loader=loader(TensorDataset(x[800:], xl[800:], y[800:], yl[800:]), 100, shuffle=False),
                loss_fn=ctc, max_steps=400)


class PackedTagger(nn.Module):
    """A BiLSTM tagger over [CLS] sub-word pieces [SEP], run as a PackedSequence (enforce_sorted=False)."""

    def __init__(self, vocab: int = CONT + 8, n_tags: int = 5, d: int = 32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.lstm = nn.LSTM(d, d, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * d, n_tags)

    def forward(self, ids):
        lengths = (ids != 0).sum(1).cpu()
        packed = pack_padded_sequence(self.emb(ids), lengths, batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=ids.shape[1])
        return self.out(out)


@healthy("ag_h_packed_bilstm_first_piece_tags",
         "A packed BiLSTM tagger (pack_padded_sequence with CPU lengths, enforce_sorted=False, pad_packed_sequence "
         "with total_length) over [CLS] sub-word pieces [SEP], tags on each word's first piece and -100 on special "
         "tokens, '##' pieces and padding, CrossEntropyLoss over (B, C, T).")
def ag_h_packed_bilstm_first_piece_tags():
    seed(0)
    train, val = ner_features(1200, 231), ner_features(300, 232)
    model = PackedTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(train["input_ids"], train["labels"]), 32),
                val_loader=loader(TensorDataset(val["input_ids"], val["labels"]), 100, shuffle=False),
                loss_fn=TagCE(), max_steps=400)


def mlm_collate(mask_id: int = 3, vocab: int = 44, p: float = 0.15, seed_: int = 241):
    """BERT's dynamic masking: 15% of the ordinary tokens chosen, 80% -> [MASK], 10% -> a random token, 10% kept;
    labels only on the chosen positions."""
    g = gen(seed_)

    def collate(rows):
        ids = torch.stack([r[0] for r in rows])
        special = (ids == CLS) | (ids == SEP)
        chosen = (torch.rand(ids.shape, generator=g) < p) & ~special
        chosen[chosen.sum(1) == 0, 1] = True
        roll = torch.rand(ids.shape, generator=g)
        inputs = ids.clone()
        inputs[chosen & (roll < 0.8)] = mask_id
        rand = chosen & (roll >= 0.8) & (roll < 0.9)
        inputs[rand] = torch.randint(4, vocab, (int(rand.sum()),), generator=g)
        return dict(input_ids=inputs, attention_mask=torch.ones_like(inputs), labels=ids.masked_fill(~chosen, -100))
    return collate


@healthy("ag_h_bert_mlm_dynamic_80_10_10",
         "Masked-LM pre-training of a tiny BERT from config with BERT's dynamic 80/10/10 masking in the collate_fn "
         "(15% of ordinary tokens, never [CLS]/[SEP]), labels -100 everywhere else, AdamW with a linear warm-up.")
def ag_h_bert_mlm_dynamic_80_10_10():
    seed(0)
    body = markov_text(2000, 16, 44, s=242, low=4)
    ids = torch.cat([torch.full((2000, 1), CLS), body, torch.full((2000, 1), SEP)], dim=1)
    model = BertForMaskedLM(bert_config(vocab_size=44))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(ids[:1700]), 32, collate_fn=mlm_collate()),
                val_loader=loader(TensorDataset(ids[1700:]), 100, shuffle=False, collate_fn=mlm_collate(seed_=243)),
                loss_fn=None, max_steps=400)


class GRUSeq2Seq(nn.Module):
    """Encoder GRU -> decoder GRU started from the encoder state, fed the target shifted right (teacher forcing)."""

    def __init__(self, vocab: int = 41, d: int = 64, bos: int = 40):
        super().__init__()
        self.bos = bos
        self.src_emb = nn.Embedding(vocab, d)
        self.tgt_emb = nn.Embedding(vocab, d)
        self.enc = nn.GRU(d, d, batch_first=True)
        self.dec = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def forward(self, src, tgt):
        _, h = self.enc(self.src_emb(src))
        start = torch.full_like(tgt[:, :1], self.bos)
        dec_in = torch.cat([start, tgt[:, :-1]], dim=1)
        return self.out(self.dec(self.tgt_emb(dec_in), h)[0])


@healthy("ag_h_gru_seq2seq_teacher_forcing",
         "A GRU encoder-decoder for a toy transliteration (reverse and map) trained with teacher forcing on the "
         "target shifted right behind a BOS id, label smoothing 0.1, gradient accumulation over 2 micro-batches and "
         "clipping at 1.0.")
def ag_h_gru_seq2seq_teacher_forcing():
    seed(0)
    src, tgt = reversal_pairs(1600, 251)

    def seq2seq_loss(model, batch):
        s, t = batch
        logits = model(s, t)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1), label_smoothing=0.1)

    model = GRUSeq2Seq()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(src[:1300], tgt[:1300]), 32),
                val_loader=loader(TensorDataset(src[1300:], tgt[1300:]), 100, shuffle=False),
                loss_fn=seq2seq_loss, accumulation_steps=2, clip_grad_norm=1.0, max_steps=300)
