"""Set ag, family shapes: a tensor laid out or reshaped so the numbers meet the wrong numbers, with no error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ag.registry import (
    acc_of,
    build_vocab,
    case,
    choice,
    ctc_greedy,
    encode,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    pad_to,
    seed,
    words,
)

# ---------------------------------------------------------------------------------------------- speech data (CTC)

N_PHONES, N_MELS = 8, 20


def phone_utterances(n: int, s: int, t_max: int = 32):
    """Frames of a toy acoustic signal: each phone is 2-4 frames of its own spectral prototype plus noise, with a
    silent frame between phones. Returns features (n, t_max, N_MELS), frame counts, phone ids 0..7 (padded with 0) and
    phone counts."""
    g = gen(s)
    protos = torch.randn(N_PHONES, N_MELS, generator=gen(4242)) * 1.5
    feats = torch.zeros(n, t_max, N_MELS)
    flens, tgts, tlens = [], torch.zeros(n, 6, dtype=torch.long), []
    for i in range(n):
        k = int(torch.randint(3, 7, (1,), generator=g))
        phones = torch.randint(0, N_PHONES, (k,), generator=g)
        t = 0
        for p in phones.tolist():
            for _ in range(int(torch.randint(2, 5, (1,), generator=g))):
                feats[i, t] = protos[p]
                t += 1
            t += 1  # silence
        feats[i, :t] += 0.6 * torch.randn(t, N_MELS, generator=g)
        flens.append(t)
        tgts[i, :k] = phones
        tlens.append(k)
    return feats, torch.tensor(flens), tgts, torch.tensor(tlens)


class AcousticModel(nn.Module):
    """Frames -> per-frame phone logits (batch, time, classes), a BiGRU acoustic model."""

    def __init__(self, n_out: int, hidden: int = 32):
        super().__init__()
        self.inp = nn.Linear(N_MELS, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, n_out)

    def forward(self, x):
        return self.out(self.rnn(torch.relu(self.inp(x)))[0])


def exact_match_ctc(blank: int, offset: int):
    """Share of validation utterances whose greedy CTC decoding equals the phone sequence (targets + offset)."""
    def metric(model, kw):
        def fn(m, b):
            x, xl, y, yl = b
            hyp = ctc_greedy(m(x), xl, blank)
            ref = [(y[i, : int(yl[i])] + offset).tolist() for i in range(len(hyp))]
            return sum(h == r for h, r in zip(hyp, ref)), len(hyp)
        return mean_over(model, kw["val_loader"], fn)
    return metric


@case("ag_ctc_log_softmax_over_batch", "shapes",
      "A BiGRU CTC phone recogniser returns batch-first logits (B, T, C); the loss transposes them to the (T, B, C) "
      "layout ctc_loss wants and then calls log_softmax(dim=1), which after the transpose is the batch axis, so each "
      "phone's scores are normalised across the utterances of the batch instead of over the classes of one frame "
      "(fix: log_softmax(dim=2) / dim=-1 on the (T, B, C) tensor).",
      r"(log_?softmax|normali[sz]).{0,120}(dim\s*=?\s*1|batch (axis|dim)|across (the )?(batch|utterances|samples))"
      r"|(batch (axis|dim)|across (the )?(batch|utterances|samples)).{0,120}(log_?softmax|normali[sz])"
      r"|(ctc|log.?prob).{0,120}(do not|don't|not|never) sum to (one|1) over (the )?(classes|vocab|labels|phones)"
      r"|log_?softmax\s*\(\s*(dim\s*=\s*)?(2|-1)\s*\)")
def ag_ctc_log_softmax_over_batch(fixed: bool = False):
    seed(0)
    x, xl, y, yl = phone_utterances(1400, 1)
    blank = 0

    def ctc(model, batch):
        feats, feat_lens, phones, phone_lens = batch
        log_probs = model(feats).transpose(0, 1)                      # (T, B, C) for ctc_loss
        log_probs = log_probs.log_softmax(dim=2 if fixed else 1)
        return F.ctc_loss(log_probs, phones + 1, feat_lens, phone_lens, blank=blank)

    model = AcousticModel(N_PHONES + 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1100], xl[:1100], y[:1100], yl[:1100]), 32),
                val_loader=loader(TensorDataset(x[1100:], xl[1100:], y[1100:], yl[1100:]), 100, shuffle=False),
                loss_fn=ctc, max_steps=400)


fix("ag_ctc_log_softmax_over_batch", fixed_of(ag_ctc_log_softmax_over_batch), exact_match_ctc(0, 1),
    "val utterance exact match (greedy CTC)", steps=120)


# ---------------------------------------------------------------------------------------------- review text helpers

FILLER = words("w", 60)


def negation_reviews(n: int, s: int, min_len: int = 8, max_len: int = 20):
    """Reviews of filler words with one polar word; 'not' right before it flips the label, and a stray 'not'
    elsewhere does not."""
    g = gen(s)
    texts, labels = [], []
    for _ in range(n):
        k = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        toks = choice(g, FILLER, k)
        polar = choice(g, ["good", "great", "bad", "awful"])
        pos = int(torch.randint(1, k, (1,), generator=g))
        negated = bool(torch.rand(1, generator=g) < 0.5)
        toks[pos] = polar
        if negated:
            toks[pos - 1] = "not"
        elif torch.rand(1, generator=g) < 0.5:
            far = [i for i in range(k) if abs(i - pos) > 2]
            if far:
                toks[choice(g, far)] = "not"
        texts.append(" ".join(toks))
        labels.append(int((polar in ("good", "great")) != negated))
    return texts, torch.tensor(labels)


class TextCNN(nn.Module):
    def __init__(self, vocab: int, max_len: int, emb: int = 32, filters: int = 48, channels_first: bool = True):
        super().__init__()
        self.channels_first = channels_first
        self.emb = nn.Embedding(vocab, emb, padding_idx=0)
        # the broken script "fixed" Conv1d's channel-count error by giving it the sequence length as in_channels
        self.conv = nn.Conv1d(emb if channels_first else max_len, filters, kernel_size=3, padding=1)
        self.fc = nn.Linear(filters, 2)

    def forward(self, ids):
        e = self.emb(ids)                                   # (B, T, E)
        if self.channels_first:
            e = e.transpose(1, 2)                           # (B, E, T): embedding dims are the channels
        return self.fc(torch.relu(self.conv(e)).max(dim=2).values)


@case("ag_textcnn_conv_over_embedding_dims", "shapes",
      "A Kim-style text CNN feeds the (B, T, E) embedding output straight into nn.Conv1d built with "
      "in_channels=max_len (20) instead of permuting to (B, E, T) with in_channels=emb_dim: the 20 token positions "
      "become channels and the kernel slides along the embedding dimensions, so no filter ever sees two neighbouring "
      "words (fix: x.transpose(1, 2) and Conv1d(emb_dim, ...)).",
      r"conv1d.{0,160}(in_channels|channels?).{0,80}(seq(uence)?[_ ]len|max_len|positions?|time steps?|tokens?)"
      r"|(seq(uence)?[_ ]len|max_len|positions?|tokens?).{0,60}(as|become|used as|treated as) (the )?(input )?channels"
      r"|(convol\w+|kernel|filters?|slid\w*).{0,60}(along|over|across) (the )?(embedding|feature|hidden) dim"
      r"|(permute|transpose)\w*.{0,60}(before|for|into|ahead of) (the |nn\.)?conv"
      r"|in_channels\s*=\s*(emb\w*|embedding_dim|d_model|hidden\w*)|\(b(atch)?,\s*e(mb\w*)?,\s*t(ime)?\)")
def ag_textcnn_conv_over_embedding_dims(fixed: bool = False):
    seed(0)
    texts, y = negation_reviews(2000, 2)
    vocab = build_vocab(texts[:1600])
    ids = pad_to([encode(t, vocab) for t in texts], 20)
    model = TextCNN(len(vocab), 20, channels_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(ids[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("ag_textcnn_conv_over_embedding_dims", fixed_of(ag_textcnn_conv_over_embedding_dims),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=150)


# ---------------------------------------------------------------------------------------------- order of two words

def intent_commands(n: int, s: int, length: int = 12):
    """Token ids of short commands: the slot word right after the marker 'to' (id 3) is one of 4 intent words
    (ids 5..8), which also occur elsewhere as distractors; label: the intent word that follows the marker."""
    g = gen(s)
    ids = torch.randint(9, 40, (n, length), generator=g)
    y = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        p, d1, d2 = torch.randperm(length - 1, generator=g)[:3].tolist()
        ids[i, d1] = int(torch.randint(5, 9, (1,), generator=g))
        ids[i, d2] = int(torch.randint(5, 9, (1,), generator=g))
        y[i] = int(torch.randint(0, 4, (1,), generator=g))
        ids[i, p], ids[i, p + 1] = 3, 5 + y[i]
    return ids, y


class OrderTransformer(nn.Module):
    def __init__(self, vocab: int = 40, d: int = 32, max_len: int = 16, batch_first: bool = True):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        if batch_first:
            layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        else:
            layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0)      # default layout: (seq, batch, feature)
        self.enc = nn.TransformerEncoder(layer, 2)
        self.fc = nn.Linear(d, 4)

    def forward(self, ids):                                                # ids: (batch, seq)
        h = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return self.fc(self.enc(h).mean(dim=1))


@case("ag_transformer_encoder_not_batch_first", "shapes",
      "An intent classifier feeds (batch, seq, dim) embeddings to an nn.TransformerEncoderLayer built without "
      "batch_first=True, which reads them as (seq, batch, dim): self-attention runs across the 32 commands of the "
      "batch at each position and never between the words of one command, so which word follows the marker (the "
      "label) is invisible (fix: TransformerEncoderLayer(..., batch_first=True) or transpose to (seq, batch, dim)).",
      r"(transformer|encoder|attention|multihead)\w*.{0,100}batch_first|batch_first.{0,60}(missing|not set|false|"
      r"default)|(attention|attends?|attend\w*|mix\w*).{0,80}(across|over|between) (the )?(batch|samples|examples|"
      r"sentences|commands)"
      r"|\((seq|s|t|time)\w*,\s*(batch|n|b)\w*,\s*(e|d|dim|emb\w*|feat\w*)\)"
      r"|(seq(uence)?[- ]first|time[- ]major|batch (dim(ension)?|axis) (is|as|treated as) (the )?(seq|time))")
def ag_transformer_encoder_not_batch_first(fixed: bool = False):
    seed(0)
    ids, y = intent_commands(2000, 3)
    model = OrderTransformer(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(ids[1600:], y[1600:]), 32, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("ag_transformer_encoder_not_batch_first", fixed_of(ag_transformer_encoder_not_batch_first),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)


# ---------------------------------------------------------------------------------------------- NER tagging

N_TAGS = 5


def tagged_sentences(n: int, s: int, t_max: int = 16, n_words: int = 90):
    """Word ids (1..n_words, 0 = pad) with one tag per word type (O is the commonest), lengths 6..t_max."""
    g = gen(s)
    word_tag = torch.randint(0, N_TAGS, (n_words + 1,), generator=gen(777))
    word_tag[: n_words // 2] = 0
    ids = torch.zeros(n, t_max, dtype=torch.long)
    tags = torch.full((n, t_max), -100, dtype=torch.long)
    for i in range(n):
        k = int(torch.randint(6, t_max + 1, (1,), generator=g))
        w = torch.randint(1, n_words + 1, (k,), generator=g)
        ids[i, :k] = w
        tags[i, :k] = word_tag[w]
    return ids, tags


class BiLSTMTagger(nn.Module):
    def __init__(self, vocab: int, n_tags: int = N_TAGS, d: int = 32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.lstm = nn.LSTM(d, d, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * d, n_tags)

    def forward(self, ids):
        return self.out(self.lstm(self.emb(ids))[0])          # (B, T, tags)


@case("ag_ner_logits_reshape_not_transpose", "shapes",
      "A BiLSTM NER tagger's logits are (B, T, num_tags) and CrossEntropyLoss wants the classes in dim 1, so the "
      "loss calls logits.reshape(B, num_tags, T) instead of logits.transpose(1, 2): reshape keeps the memory order "
      "and scatters scores of different tokens and tags into each (tag, position) slot, so every target is scored "
      "against unrelated numbers (fix: logits.permute(0, 2, 1) / transpose(1, 2), or flatten to (B*T, C)).",
      r"(reshape|\.view)\b.{0,160}(instead of|rather than|not|≠|!=|where .{0,20} needed).{0,30}(transpose|permute)"
      r"|(transpose|permute).{0,80}(instead of|rather than|not) .{0,20}(reshape|view)"
      r"|(reshape|view)\w*.{0,80}(scrambl|shuffl|mix|interleav|reorder)\w* .{0,40}(tokens?|positions?|tags?|classes|"
      r"scores)|(scrambl|shuffl|interleav)\w*.{0,80}(reshape|view)"
      r"|(scores|logits|values) of (different|other|unrelated) (tokens?|positions?|tags?)")
def ag_ner_logits_reshape_not_transpose(fixed: bool = False):
    seed(0)
    ids, tags = tagged_sentences(1500, 5)

    class TagLoss(nn.Module):
        def forward(self, logits, target):
            b, t, c = logits.shape
            scores = logits.transpose(1, 2) if fixed else logits.reshape(b, c, t)
            return F.cross_entropy(scores, target, ignore_index=-100)

    model = BiLSTMTagger(91)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:1200], tags[:1200]), 32),
                val_loader=loader(TensorDataset(ids[1200:], tags[1200:]), 100, shuffle=False),
                loss_fn=TagLoss(), max_steps=500)


fix("ag_ner_logits_reshape_not_transpose", fixed_of(ag_ner_logits_reshape_not_transpose),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val token accuracy", steps=150)


# ---------------------------------------------------------------------------------------------- BiGRU sentence classifier

def keyword_reviews(n: int, s: int, length: int = 14):
    """Filler words with 2 sentiment words; label: the first sentiment word's polarity (so order matters a little)."""
    g = gen(s)
    pos_w, neg_w = words("pos", 12), words("neg", 12)
    texts, labels = [], []
    for _ in range(n):
        toks = choice(g, FILLER, length)
        label = int(torch.rand(1, generator=g) < 0.5)
        a, b = sorted(torch.randperm(length, generator=g)[:2].tolist())
        toks[a] = choice(g, pos_w if label else neg_w)
        toks[b] = choice(g, pos_w if torch.rand(1, generator=g) < 0.5 else neg_w) if torch.rand(1, generator=g) < 0.3 \
            else choice(g, pos_w if label else neg_w)
        texts.append(" ".join(toks))
        labels.append(label)
    return texts, torch.tensor(labels)


class BiGRUClassifier(nn.Module):
    def __init__(self, vocab: int, d: int = 32, hidden: int = 32, cat_directions: bool = True):
        super().__init__()
        self.cat_directions = cat_directions
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.gru = nn.GRU(d, hidden, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, 2)

    def forward(self, ids):
        _, h_n = self.gru(self.emb(ids))                      # h_n: (2, B, H), directions first even if batch_first
        if self.cat_directions:
            feats = torch.cat([h_n[0], h_n[1]], dim=1)        # (B, 2H): forward and backward state of each sentence
        else:
            feats = h_n.view(ids.shape[0], -1)                # (B, 2H) by memory order: rows of different sentences
        return self.fc(feats)


def bigru_case(fixed: bool):
    seed(0)
    texts, y = keyword_reviews(1800, 6)
    vocab = build_vocab(texts[:1400])
    ids = pad_to([encode(t, vocab) for t in texts], 14)
    model = BiGRUClassifier(len(vocab), cat_directions=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:1400], y[:1400]), 32),
                val_loader=loader(TensorDataset(ids[1400:], y[1400:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


@case("ag_bigru_hidden_view_mixes_batch", "shapes",
      "A bidirectional GRU sentence classifier (batch_first=True) turns its final hidden state h_n, shaped "
      "(num_directions, B, H) whatever batch_first says, into features with h_n.view(B, -1): the view follows memory "
      "order, so row i holds the states of sentences 2i and 2i+1 (both forward) or of other sentences' backward pass, "
      "and each label is trained against another sentence's encoding (fix: torch.cat([h_n[0], h_n[1]], dim=1) or "
      "h_n.permute(1, 0, 2).reshape(B, -1)).",
      r"h_?n\b.{0,120}(view|reshape)|(view|reshape).{0,120}h_?n\b"
      r"|hidden( state)?.{0,80}(\(num_layers|num_directions|directions? first|batch (is|in) (the )?(second|dim(ension)? 1))"
      r"|(another|other|different|neighbou?ring) (sentence|sample|example|item)s?'?s? (hidden|encoding|state|features)"
      r"|torch\.cat\s*\(\s*\[?\s*h\w*\[\s*(0|-2)\s*\]|permute\s*\(\s*1\s*,\s*0\s*,\s*2\s*\)")
def ag_bigru_hidden_view_mixes_batch(fixed: bool = False):
    return bigru_case(fixed)


fix("ag_bigru_hidden_view_mixes_batch", fixed_of(ag_bigru_hidden_view_mixes_batch),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=150)
