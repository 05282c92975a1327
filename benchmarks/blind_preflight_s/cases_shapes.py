"""Set s, family "shapes": a tensor laid out one way and read another, with no error raised.

Each builder returns the keyword arguments a user would pass to ``run_preflight``; ``fixed=True`` applies the one-line
fix (``verify.py`` trains both).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_s.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------------
# 1. Vibration windows through nn.TransformerEncoder built with the default batch_first=False, fed (batch, time, ch).


def vibration_windows(n: int, s: int, steps: int = 24, channels: int = 4):
    """One burst (a short 4-cycle oscillation) in the channel named by the label, at a random time, never at the end."""
    g = gen(s)
    x = 0.4 * torch.randn(n, steps, channels, generator=g)
    y = torch.randint(0, channels, (n,), generator=g)
    start = torch.randint(0, steps - 10, (n,), generator=g)
    burst = 1.5 * torch.sin(torch.arange(6) * (2 * math.pi / 3))
    t = start[:, None] + torch.arange(6)                     # (n, 6) time indices of each burst
    x[torch.arange(n)[:, None], t, y[:, None]] += burst
    return x, y


class VibrationTransformer(nn.Module):
    def __init__(self, channels: int = 4, d_model: int = 32, n_classes: int = 4, steps: int = 24,
                 batch_first: bool = False):
        super().__init__()
        self.inp = nn.Linear(channels, d_model)
        self.pos = nn.Parameter(0.02 * torch.randn(1, steps, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=64, dropout=0.0,
                                           batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, x):                      # x: (batch, time, channels), as the windows are stored
        h = self.encoder(self.inp(x) + self.pos)
        return self.head(h[:, -1])             # the last time step summarises the window, as an LSTM's would


@case("vibration_transformer_default_seq_first", "shapes",
      "nn.TransformerEncoderLayer is built with its default batch_first=False but fed (batch, time, channels) "
      "windows: self-attention runs across the 32 windows of the batch at each time step instead of across the 24 "
      "time steps of a window, so the last position never sees the burst",
      r"batch_first|seq(uence)?[_ -]?first|\(\s*(seq|S|T|L)\w*\s*,\s*(batch|N|B)\w*\s*,|"
      r"(attend|attention|attends)\w*\W+(\w+\W+){0,6}(across|over|along)\W+(\w+\W+){0,3}(batch|samples)|"
      r"(batch|first) (dim\w*|axis) (is )?(treated|read|taken|used) as (the )?(seq|sequence|time)|"
      r"(transpose|permute)\w*\W+(\w+\W+){0,6}(batch|time|seq)\w* (and|<->|with) (batch|time|seq)")
def vibration_transformer_default_seq_first(fixed: bool = False):
    seed(0)
    x, y = vibration_windows(1600, 1)
    xv, yv = vibration_windows(512, 2)
    model = VibrationTransformer(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=400)


fix("vibration_transformer_default_seq_first", fixed_of(vibration_transformer_default_seq_first),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# 2. Intent classifier on a bidirectional LSTM whose h_n (directions, batch, hidden) is .view()-ed to (batch, -1).


def intent_utterances(n: int, s: int, length: int = 12, n_intents: int = 5, vocab: int = 60):
    """Filler tokens 10..vocab-1 and one intent keyword (two per intent: 2k, 2k+1) at a random position."""
    g = gen(s)
    tokens = torch.randint(10, vocab, (n, length), generator=g)
    y = torch.randint(0, n_intents, (n,), generator=g)
    kw = 2 * y + torch.randint(0, 2, (n,), generator=g)
    pos = torch.randint(0, length, (n,), generator=g)
    tokens[torch.arange(n), pos] = kw
    return tokens, y


class IntentBiLSTM(nn.Module):
    def __init__(self, vocab: int = 60, emb: int = 24, hidden: int = 24, n_classes: int = 5, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, n_classes)

    def forward(self, tokens):
        _, (h_n, _) = self.lstm(self.emb(tokens))          # h_n: (2 directions, batch, hidden) even if batch_first
        if self.fixed:
            feats = torch.cat([h_n[0], h_n[1]], dim=1)     # forward and backward final states of each utterance
        else:
            feats = h_n.view(tokens.size(0), -1)           # "flatten the directions": rows of other utterances
        return self.out(feats)


@case("intent_bilstm_hidden_view", "shapes",
      "the bidirectional LSTM's h_n has shape (num_directions, batch, hidden) even with batch_first=True, and "
      "h_n.view(batch, -1) reads it in memory order, so the feature row of an utterance is made of the final states "
      "of other utterances in the batch (forward states of two neighbours, or backward states)",
      r"h_n|h_?n\b|hidden state\w*\W+(\w+\W+){0,8}(view|reshape|flatten|mix|other (samples|rows|utterances))|"
      r"\(\s*(num_)?(layers|directions|D)\w*\s*[*x,]|num_directions|"
      r"(view|reshape)\w*\W+(\w+\W+){0,6}(mix|mixes|mixing|scrambl|interleav)\w*\W+(\w+\W+){0,4}(batch|samples|rows)|"
      r"(permute|transpose)\(\s*1\s*,\s*0|torch\.cat\(\s*\[?\s*h\w*\[\s*-?[0-2]")
def intent_bilstm_hidden_view(fixed: bool = False):
    seed(0)
    x, y = intent_utterances(1600, 3)
    xv, yv = intent_utterances(512, 4)
    model = IntentBiLSTM(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("intent_bilstm_hidden_view", fixed_of(intent_bilstm_hidden_view),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=200)

# --------------------------------------------------------------------------------------------------------------------
# 3. Lead-swap detector: (batch, leads, samples) ECG windows reshaped, not transposed, to (batch, samples, leads).


def ecg_lead_windows(n: int, s: int, leads: int = 6, samples: int = 40):
    """Smooth AR(1) traces per lead; lead 1 follows lead 0 (0: wired right), follows it inverted (1: electrodes
    swapped) or is independent of it (2: electrode off)."""
    g = gen(s)
    noise = torch.randn(n, leads, samples, generator=g)
    x = torch.zeros(n, leads, samples)
    for t in range(samples):
        x[:, :, t] = (0.8 * x[:, :, t - 1] if t else 0.0) + noise[:, :, t]
    y = torch.randint(0, 3, (n,), generator=g)
    sign = torch.tensor([1.0, -1.0, 0.0])[y]
    follow = sign[:, None] * x[:, 0] + 0.4 * torch.randn(n, samples, generator=g)
    x[:, 1] = torch.where((y == 2)[:, None], x[:, 1], follow)
    return x / 2, y


class LeadSwapGRU(nn.Module):
    def __init__(self, leads: int = 6, hidden: int = 48, n_classes: int = 3, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.gru = nn.GRU(leads, hidden, batch_first=True)
        self.out = nn.Linear(hidden, n_classes)

    def forward(self, ecg):                    # ecg: (batch, leads, samples), channels-first as recorded
        b, leads, samples = ecg.shape
        if self.fixed:
            seq = ecg.transpose(1, 2)
        else:
            seq = ecg.reshape(b, samples, leads)  # "the GRU wants (batch, time, features)"
        _, h = self.gru(seq)
        return self.out(h[-1])


@case("ecg_leads_reshape_not_transpose", "shapes",
      "the (batch, leads, samples) ECG window is turned into the GRU's (batch, samples, leads) with reshape instead of "
      "transpose: the shape is right but each 'time step' holds 6 consecutive samples of one lead (lead-major memory "
      "order), so the values of the leads at the same instant are never seen together",
      r"reshape\w*\W+(\w+\W+){0,8}(instead of|rather than|not)\W+(\w+\W+){0,3}(transpose|permute)|"
      r"(transpose|permute)\w*\W+(\w+\W+){0,8}(instead of|rather than|not)\W+(\w+\W+){0,3}(reshape|view)|"
      r"(lead|channel)[- ]major|memory order|(scrambl|interleav)\w*\W+(\w+\W+){0,6}(time|samples?|leads?|channels?)|"
      r"(leads?|channels?)\W+(\w+\W+){0,3}(and|vs\.?|/) (time|samples?|steps?)\W+(\w+\W+){0,6}(swap|mix|scrambl|mistak|confus)|"
      r"(leads?|channels?), ?(samples|time|frames)\)?\W+(\w+\W+){0,8}(reshape|view)\w*\W+(\w+\W+){0,4}(samples|time|frames), ?(leads?|channels?)")
def ecg_leads_reshape_not_transpose(fixed: bool = False):
    seed(0)
    x, y = ecg_lead_windows(1600, 5)
    xv, yv = ecg_lead_windows(512, 6)
    model = LeadSwapGRU(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=4e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("ecg_leads_reshape_not_transpose", fixed_of(ecg_leads_reshape_not_transpose),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# 4. POS-style tagger on a sequence-first GRU: (time, batch, tags) logits flattened against (batch, time) tags.


def tagged_sentences(n: int, s: int, length: int = 10, vocab: int = 40, n_tags: int = 5):
    """Tag of a token: token % n_tags, shifted by one after the marker token 1."""
    g = gen(s)
    tokens = torch.randint(2, vocab, (n, length), generator=g)
    marker = torch.rand(n, length, generator=g) < 0.15
    tokens[marker] = 1
    prev_marker = torch.zeros_like(marker)
    prev_marker[:, 1:] = marker[:, :-1]
    tags = (tokens + prev_marker.long()) % n_tags
    return tokens, tags


class SeqFirstTagger(nn.Module):
    def __init__(self, vocab: int = 40, emb: int = 32, hidden: int = 48, n_tags: int = 5):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.gru = nn.GRU(emb, hidden)           # sequence-first, the nn.GRU default
        self.out = nn.Linear(hidden, n_tags)

    def forward(self, tokens):                 # tokens: (batch, time)
        out, _ = self.gru(self.emb(tokens).transpose(0, 1))
        return self.out(out)                   # (time, batch, tags)


def tagger_loss(fixed: bool):
    def loss_fn(model, batch):
        tokens, tags = batch
        logits = model(tokens)
        if fixed:
            logits = logits.transpose(0, 1)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tags.reshape(-1))
    return loss_fn


@case("tagger_seq_first_logits_flattened", "shapes",
      "the tagger's GRU is sequence-first, so its logits are (time, batch, tags); flattening them with "
      "reshape(-1, tags) against the (batch, time) tags flattened the same way pairs the logit of (time t, sentence b) "
      "with the tag of another sentence and position, so the loss teaches only the tag frequencies",
      r"(time|seq\w*|T|L)\s*,\s*(batch|B|N)\b|seq(uence)?[_ -]?first|batch_first|"
      r"(flatten|reshape|view)\w*\W+(\w+\W+){0,10}(misalign|mismatch|different (order|layout)|wrong (order|position|sample))|"
      r"(misalign|mismatch|pair)\w*\W+(\w+\W+){0,8}(logits?|predictions?)\W+(\w+\W+){0,6}(tags?|labels?|targets?)\W+(\w+\W+){0,6}(other|another|wrong|different)|"
      r"(transpose|permute)\w*\W+(\w+\W+){0,6}(logits?|output)\w*\W+(\w+\W+){0,6}(before|prior)")
def tagger_seq_first_logits_flattened(fixed: bool = False):
    seed(0)
    x, y = tagged_sentences(1600, 7)
    xv, yv = tagged_sentences(512, 8)
    model = SeqFirstTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x, y), 32, drop_last=True),
                val_loader=loader(TensorDataset(xv, yv), 64, shuffle=False),
                loss_fn=tagger_loss(fixed), max_steps=500)


fix("tagger_seq_first_logits_flattened", fixed_of(tagger_seq_first_logits_flattened),
    acc_of(lambda m, b: (m(b[0]).transpose(0, 1).argmax(-1), b[1])), "val token accuracy", steps=200)

# --------------------------------------------------------------------------------------------------------------------
# 5. Repurchase-rating recommender with DIN-style attention pooling; softmax over the size-1 score dimension.


def repurchase_histories(n: int, s: int, n_items: int = 100, hist: int = 8):
    """A user's last 8 distinct items with the star rating they gave; the candidate is one of them; the target is the
    rating given to it before."""
    g = gen(s)
    items = torch.stack([torch.randperm(n_items, generator=g)[:hist] for _ in range(n)])
    ratings = torch.randint(1, 6, (n, hist), generator=g).float()
    which = torch.randint(0, hist, (n,), generator=g)
    cand = items[torch.arange(n), which]
    target = ratings[torch.arange(n), which]
    return items, ratings, cand, target


class RepurchaseRater(nn.Module):
    def __init__(self, n_items: int = 100, dim: int = 32, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.item = nn.Embedding(n_items, dim)
        self.rating = nn.Linear(1, dim)
        self.att = nn.Sequential(nn.Linear(3 * dim, 32), nn.ReLU(), nn.Linear(32, 1))
        self.out = nn.Sequential(nn.Linear(2 * dim, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, items, ratings, cand):
        k = self.item(items)                                   # (batch, hist, dim)
        v = k + self.rating((ratings.unsqueeze(-1) - 3.0) / 2.0)
        q = self.item(cand).unsqueeze(1).expand_as(k)
        scores = self.att(torch.cat([q, k, q * k], dim=-1))    # (batch, hist, 1)
        w = torch.softmax(scores, dim=1 if self.fixed else -1)  # dim=-1 is the size-1 score axis: every weight is 1.0
        pooled = (w * v).sum(1)
        return 3.0 + self.out(torch.cat([pooled, q[:, 0]], dim=-1)).squeeze(-1)


def repurchase_loss(model, batch):
    items, ratings, cand, target = batch
    return F.mse_loss(model(items, ratings, cand), target)


@case("repurchase_attention_softmax_size1_dim", "shapes",
      "the attention scores have shape (batch, history, 1) and torch.softmax(scores, dim=-1) normalises over the "
      "size-1 last axis, so every attention weight is exactly 1.0: the pooling is a plain sum over the history and "
      "cannot pick out the candidate item's past rating",
      r"softmax\w*\W+(\w+\W+){0,10}(size[- ]?1|singleton|length[- ]?1|dim(ension)?\s*(=|of)?\s*-?1|last (axis|dim))|"
      r"(size[- ]?1|singleton)\W+(\w+\W+){0,8}(softmax|normali[sz])|"
      r"(attention )?weights?\W+(\w+\W+){0,6}(all|every|always|identically|exactly)\W+(\w+\W+){0,3}(1(\.0)?|one)\b|"
      r"(all|every)\W+(\w+\W+){0,3}(ones|1\.0)\W+(\w+\W+){0,6}(softmax|attention)|"
      r"softmax\w*\W+(\w+\W+){0,6}(wrong|over the) (dim|axis)|dim\s*=\s*1\b")
def repurchase_attention_softmax_size1_dim(fixed: bool = False):
    seed(0)
    tr = repurchase_histories(3200, 9)
    va = repurchase_histories(800, 10)
    model = RepurchaseRater(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(*tr), 64), val_loader=loader(TensorDataset(*va), 128, shuffle=False),
                loss_fn=repurchase_loss, max_steps=600)


fix("repurchase_attention_softmax_size1_dim", fixed_of(repurchase_attention_softmax_size1_dim),
    rmse_of(lambda m, b: (m(b[0], b[1], b[2]), b[3])), "val RMSE (stars)", steps=400, higher=False)
