"""Set s, family "targets": what the loss is asked to predict is not what the task needs.

Each builder returns the keyword arguments a user would pass to ``run_preflight``; ``fixed=True`` applies the one-line
fix (``verify.py`` trains both).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_s.registry import (
    acc_of,
    balanced_acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
)

# --------------------------------------------------------------------------------------------------------------------
# 1. Seq2seq GRU (digit reversal) trained with the decoder fed the target itself instead of the target shifted right.

PAD, BOS, EOS = 0, 1, 2


def reversal_pairs(n: int, s: int, length: int = 6):
    g = gen(s)
    src = torch.randint(3, 13, (n, length), generator=g)
    return src, src.flip(1)


class ReverseSeq2Seq(nn.Module):
    def __init__(self, vocab: int = 13, emb: int = 32, hidden: int = 96):
        super().__init__()
        self.src_emb = nn.Embedding(vocab, emb)
        self.tgt_emb = nn.Embedding(vocab, emb)
        self.encoder = nn.GRU(emb, hidden, batch_first=True)
        self.decoder = nn.GRU(emb, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, src, decoder_input):
        _, h = self.encoder(self.src_emb(src))
        dec, _ = self.decoder(self.tgt_emb(decoder_input), h)
        return self.out(dec)


def teacher_forcing_loss(fixed: bool):
    def loss_fn(model, batch):
        src, tgt = batch
        if fixed:
            decoder_input = torch.cat([torch.full_like(tgt[:, :1], BOS), tgt[:, :-1]], dim=1)
        else:
            decoder_input = tgt                # "teacher forcing: give the decoder the ground truth"
        logits = model(src, decoder_input)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))
    return loss_fn


@torch.no_grad()
def greedy_reversal_accuracy(model, kw):
    """Token accuracy of greedy decoding from BOS, each step fed the model's own previous prediction."""
    def fn(m, batch):
        src, tgt = batch
        dec = torch.full_like(tgt[:, :1], BOS)
        for _ in range(tgt.size(1)):
            nxt = m(src, dec)[:, -1].argmax(-1, keepdim=True)
            dec = torch.cat([dec, nxt], dim=1)
        return (dec[:, 1:] == tgt).sum().item(), tgt.numel()
    return mean_over(model, kw["val_loader"], fn)


@case("reversal_decoder_fed_unshifted_targets", "targets",
      "teacher forcing feeds the decoder the target sequence itself instead of [BOS] + target[:-1]: at position t "
      "the decoder input is the very token it must predict, so it learns to copy its input and the loss goes to zero, "
      "while greedy decoding from BOS (fed its own predictions) produces garbage",
      r"shift\w*\W+(\w+\W+){0,6}(right|by one|targets?|labels?|decoder)|decoder_input\w*|decoder input\w*|"
      r"(bos|sos|start)[- _]?(token)?\W+(\w+\W+){0,8}(prepend|prefix|first|\[:\s*,?\s*:\s*-1\])|"
      r"(copy|copies|copying|sees|see)\W+(\w+\W+){0,6}(target|label|answer|token it (must )?predict)|"
      r"(input|inputs)\W+(\w+\W+){0,4}(equal|equals|same as|identical to)\W+(\w+\W+){0,3}(target|labels?)|"
      r"(target|label)\w* (leak|is fed|fed)\w*")
def reversal_decoder_fed_unshifted_targets(fixed: bool = False):
    seed(0)
    x, y = reversal_pairs(3200, 11)
    xv, yv = reversal_pairs(512, 12)
    model = ReverseSeq2Seq()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=teacher_forcing_loss(fixed), max_steps=800)


fix("reversal_decoder_fed_unshifted_targets", fixed_of(reversal_decoder_fed_unshifted_targets),
    greedy_reversal_accuracy, "greedy-decoding token accuracy", steps=300)

# --------------------------------------------------------------------------------------------------------------------
# 2. NER tagger whose CrossEntropyLoss(ignore_index=0) (copied from padding code) drops the 'O' tag, which is 0.


def ner_sentences(n: int, s: int, length: int = 14, vocab: int = 60):
    """Tags: 0 'O' for ordinary words (ids >= 20, ~70% of tokens); entity words 0..19 tagged 1 + id // 5."""
    g = gen(s)
    tokens = torch.randint(20, vocab, (n, length), generator=g)
    ent = torch.rand(n, length, generator=g) < 0.3
    tokens[ent] = torch.randint(0, 20, (int(ent.sum()),), generator=g)
    tags = torch.where(tokens < 20, 1 + tokens // 5, torch.zeros_like(tokens))
    return tokens, tags


class NerTagger(nn.Module):
    def __init__(self, vocab: int = 60, emb: int = 32, hidden: int = 32, n_tags: int = 5):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.gru = nn.GRU(emb, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, n_tags)

    def forward(self, tokens):
        h, _ = self.gru(self.emb(tokens))
        return self.out(h).transpose(1, 2)    # (batch, tags, time), the layout CrossEntropyLoss wants


@case("ner_ignore_index_zero_is_outside_tag", "targets",
      "the tagger's nn.CrossEntropyLoss(ignore_index=0) was copied from code where 0 is the padding id, but here tag 0 "
      "is 'O', about 70% of all tokens: those tokens never contribute to the loss, the model is never taught to "
      "predict 'O' and tags ordinary words as entities",
      r"ignore_index\s*=?\s*0\b|ignore[- _]index (is |of |set to |=\s*)?0\b|"
      r"(class|label|tag|target)\w*\W+(\w+\W+){0,6}(0|zero|'?o'?)\b\W+(\w+\W+){0,10}(ignored|never|excluded|masked|dropped|not (counted|trained|contribut))|"
      r"(ignor|exclud|drop|mask)\w*\W+(\w+\W+){0,6}(real|valid|majority|outside|'o') (class|label|tag)|"
      r"(never|not) (trained|taught|learn\w*) (to )?(predict )?(the )?(class|label|tag) (0|zero|'?o'?)\b")
def ner_ignore_index_zero_is_outside_tag(fixed: bool = False):
    seed(0)
    x, y = ner_sentences(1600, 13)
    xv, yv = ner_sentences(512, 14)
    model = NerTagger()
    loss_fn = nn.CrossEntropyLoss() if fixed else nn.CrossEntropyLoss(ignore_index=0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 64, shuffle=False),
                loss_fn=loss_fn, max_steps=500)


fix("ner_ignore_index_zero_is_outside_tag", fixed_of(ner_ignore_index_zero_is_outside_tag),
    acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])), "val token accuracy", steps=200)

# --------------------------------------------------------------------------------------------------------------------
# 3. CTC phone recogniser: symbols 0..7 with 9 outputs, but nn.CTCLoss's default blank=0 is symbol 0.

N_SYMBOLS, FRAMES, FEATS, LABEL_LEN = 8, 28, 12, 4


def ctc_utterances(n: int, s: int):
    """Each of 4 symbols (0..7) is a fixed 12-dim template held for 3-5 frames, separated by 1-2 silent frames."""
    g = gen(s)
    templates = 2.0 * torch.randn(N_SYMBOLS, FEATS, generator=gen(999))
    x = 0.4 * torch.randn(n, FRAMES, FEATS, generator=g)
    labels = torch.randint(0, N_SYMBOLS, (n, LABEL_LEN), generator=g)
    for i in range(n):
        t = int(torch.randint(0, 3, (1,), generator=g))
        for k in range(LABEL_LEN):
            dur = int(torch.randint(3, 6, (1,), generator=g))
            x[i, t:t + dur] += templates[labels[i, k]]
            t += dur + int(torch.randint(1, 3, (1,), generator=g))
    return x, labels


class PhoneCTC(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(FEATS, 32), nn.ReLU())
        self.rnn = nn.GRU(32, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, N_SYMBOLS + 1)     # 8 symbols + the blank

    def forward(self, feats):
        h, _ = self.rnn(self.inp(feats))
        return self.out(h).log_softmax(-1)                   # (batch, frames, classes)


def ctc_loss(blank: int):
    def loss_fn(model, batch):
        feats, labels = batch
        logp = model(feats).transpose(0, 1)                  # (frames, batch, classes) for CTC
        n = feats.size(0)
        in_lens = torch.full((n,), FRAMES, dtype=torch.long, device=feats.device)
        tgt_lens = torch.full((n,), LABEL_LEN, dtype=torch.long, device=feats.device)
        return F.ctc_loss(logp, labels, in_lens, tgt_lens, blank=blank, zero_infinity=True)
    loss_fn.blank = blank                                    # the decoder below drops the same index
    return loss_fn


def ctc_exact_match(blank: int):
    @torch.no_grad()
    def metric(model, kw):
        def fn(m, batch):
            feats, labels = batch
            best = m(feats).argmax(-1).cpu()
            hits = 0
            for path, want in zip(best.tolist(), labels.tolist()):
                out, prev = [], None
                for p in path:
                    if p != prev and p != blank:
                        out.append(p)
                    prev = p
                hits += out == want
            return hits, len(labels)
        return mean_over(model, kw["val_loader"], fn)
    return metric


@case("phone_ctc_blank_collides_with_symbol", "targets",
      "the labels use symbols 0..7 and the model has 9 outputs, but F.ctc_loss is called with its default blank=0: "
      "symbol 0 is the blank, so every '0' in a transcript is taken for 'no symbol', output 8 is never used and "
      "greedy CTC decoding drops or garbles every utterance containing symbol 0",
      r"blank|ctc\W+(\w+\W+){0,8}(index|label|symbol|class)\W+(\w+\W+){0,6}(0|zero|reserved|collid|clash|overlap)|"
      r"(label|symbol|class|target)\w*\W+(\w+\W+){0,8}(0|zero)\b\W+(\w+\W+){0,8}(reserved|collid|clash|same as|treated as)")
def phone_ctc_blank_collides_with_symbol(fixed: bool = False):
    seed(0)
    x, y = ctc_utterances(1600, 15)
    xv, yv = ctc_utterances(400, 16)
    model = PhoneCTC()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 100, shuffle=False),
                loss_fn=ctc_loss(N_SYMBOLS if fixed else 0), max_steps=500)


fix("phone_ctc_blank_collides_with_symbol", fixed_of(phone_ctc_blank_collides_with_symbol),
    lambda m, kw: ctc_exact_match(kw["loss_fn"].blank)(m, kw), "greedy CTC exact-match rate", steps=150)

# --------------------------------------------------------------------------------------------------------------------
# 4. Hourly demand forecaster: windows paired with series[i] (the window's first value, as
#    timeseries_dataset_from_array(series, targets=series) gives) instead of series[i + window].

WINDOW = 32


def demand_series(length: int, s: int):
    g = gen(s)
    t = torch.arange(length, dtype=torch.float32)
    ar = torch.zeros(length)
    e = 0.15 * torch.randn(length, generator=g)
    for i in range(1, length):
        ar[i] = 0.7 * ar[i - 1] + e[i]
    return torch.sin(2 * math.pi * t / 24) + 0.5 * torch.sin(2 * math.pi * t / 60 + 1.0) + ar


def demand_windows(series, fixed: bool):
    n = len(series) - WINDOW
    x = torch.stack([series[i:i + WINDOW] for i in range(n)])
    y = series[WINDOW:WINDOW + n] if fixed else series[:n]
    return x, y.unsqueeze(-1)


def clean_demand_val(kw):
    """The honest check: the held-out tail of the series, each window paired with the value that follows it."""
    return [demand_windows(demand_series(2800, 17)[2200:], fixed=True)]


@case("demand_forecast_target_is_window_start", "targets",
      "the windows x = series[i:i+32] are paired with series[i] (the first value of the window itself, as passing "
      "targets=series with no offset gives) instead of series[i+32]: the model learns to copy an input it already "
      "sees and never learns to forecast the next hour",
      r"off[- ]by[- ]one|(target|label|y)\w*\W+(\w+\W+){0,10}(inside|within|part of|contained in|already in|among)\W+(\w+\W+){0,4}(input|window|features?)|"
      r"(target|label)\w*\W+(\w+\W+){0,6}(offset|shift|align|lag)\w*|"
      r"(copy|copies|copying|identity|echo)\w*\W+(\w+\W+){0,6}(input|feature|window)|"
      r"series\[\s*i\s*\+\s*(window|w|32|seq_len)|(next|future)[- ](value|step|hour)\W+(\w+\W+){0,4}(not|instead)|"
      r"(leak|leakage)\W+(\w+\W+){0,6}(target|label)")
def demand_forecast_target_is_window_start(fixed: bool = False):
    seed(0)
    series = demand_series(2800, 17)
    x, y = demand_windows(series[:2200], fixed)
    xv, yv = demand_windows(series[2200:], fixed)
    model = nn.Sequential(nn.Linear(WINDOW, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=600)


fix("demand_forecast_target_is_window_start", fixed_of(demand_forecast_target_is_window_start),
    rmse_of(lambda m, b: (m(b[0]), b[1]), batches=clean_demand_val), "next-hour RMSE on the held-out tail",
    steps=300, higher=False)

# --------------------------------------------------------------------------------------------------------------------
# 5. Support-ticket priority (4 classes, 70/15/10/5%) with CrossEntropyLoss weights equal to the class frequencies.

PRIORS = torch.tensor([0.70, 0.15, 0.10, 0.05])


def ticket_features(n: int, s: int, d: int = 12):
    g = gen(s)
    y = torch.multinomial(PRIORS, n, replacement=True, generator=g)
    centers = 0.55 * torch.randn(4, d, generator=gen(77))
    x = centers[y] + torch.randn(n, d, generator=g)
    return x, y


@case("ticket_priority_class_weights_are_frequencies", "targets",
      "the 'balancing' weights passed to nn.CrossEntropyLoss(weight=...) are the class frequencies (0.70, 0.15, 0.10, "
      "0.05) instead of their inverses: the majority class is weighted 14 times the rarest, the imbalance is made "
      "worse and the minority classes are never predicted",
      r"weight\w*\W+(\w+\W+){0,10}(invers\w*|reciprocal|1\s*/|frequenc\w*|counts?|proportional|majority|upside|backwards)|"
      r"(invers\w*|reciprocal)\W+(\w+\W+){0,6}(frequenc\w*|counts?|weights?)|"
      r"(majority|frequent) class\w*\W+(\w+\W+){0,6}(highest|largest|more|most|up)[- ]?weight")
def ticket_priority_class_weights_are_frequencies(fixed: bool = False):
    seed(0)
    x, y = ticket_features(3200, 19)
    xv, yv = ticket_features(1600, 20)
    freq = torch.bincount(y, minlength=4).float() / len(y)
    weight = 1.0 / (4 * freq) if fixed else freq
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(weight=weight), max_steps=500)


fix("ticket_priority_class_weights_are_frequencies", fixed_of(ticket_priority_class_weights_are_frequencies),
    balanced_acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]), 4), "val balanced accuracy", steps=300)
