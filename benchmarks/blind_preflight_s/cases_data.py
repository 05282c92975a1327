"""Set s, family "data": what the loader delivers (collate, truncation, streaming order, encodings, per-sample
preprocessing) is not what the model needs to learn the task.

Each builder returns the keyword arguments a user would pass to ``run_preflight``; ``fixed=True`` applies the one-line
fix (``verify.py`` trains both).
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from benchmarks.blind_preflight_s.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

PAD = 0


class Rows(Dataset):
    def __init__(self, seqs, labels):
        self.seqs, self.labels = seqs, labels

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return self.seqs[i], self.labels[i]


# --------------------------------------------------------------------------------------------------------------------
# 1. Ticket router on nn.TransformerEncoder read at its [CLS] position, whose collate_fn builds a Hugging Face style
#    attention_mask (True = real token) and passes it as src_key_padding_mask (True = ignore): attention only ever
#    sees the padding, so the [CLS] output carries nothing about the ticket.

MAX_LEN, CLS = 24, 1


def keyword_tickets(n: int, s: int):
    """[CLS], then 5..19 fillers 6..59 with one queue keyword 2..5 (the label) at a random place."""
    g = gen(s)
    seqs, labels = [], []
    for _ in range(n):
        length = int(torch.randint(6, 21, (1,), generator=g))
        seq = torch.randint(6, 60, (length,), generator=g)
        seq[0] = CLS
        queue = int(torch.randint(0, 4, (1,), generator=g))
        seq[int(torch.randint(1, length, (1,), generator=g))] = 2 + queue
        seqs.append(seq)
        labels.append(queue)
    return seqs, torch.tensor(labels)


def ticket_collate(fixed: bool):
    def collate(batch):
        seqs, labels = zip(*batch)
        tokens = torch.full((len(seqs), MAX_LEN), PAD, dtype=torch.long)
        for i, s in enumerate(seqs):
            tokens[i, :len(s)] = s
        if fixed:
            mask = tokens == PAD                       # src_key_padding_mask: True where the position is padding
        else:
            mask = tokens != PAD                       # attention_mask as the tokenizer returns it: True = real token
        return tokens, mask, torch.stack(list(labels))
    return collate


class TicketEncoder(nn.Module):
    def __init__(self, vocab: int = 60, d: int = 32, n_classes: int = 4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=PAD)
        self.pos = nn.Parameter(0.1 * torch.randn(1, MAX_LEN, d))
        layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d, n_classes)

    def forward(self, tokens, key_padding_mask):
        h = self.encoder(self.emb(tokens) + self.pos, src_key_padding_mask=key_padding_mask)
        return self.head(h[:, 0])                      # the [CLS] position


def ticket_loss(model, batch):
    tokens, mask, labels = batch
    return F.cross_entropy(model(tokens, mask), labels)


@case("ticket_padding_mask_inverted", "data",
      "the collate_fn builds attention_mask = tokens != PAD (True for real tokens, the Hugging Face convention) and "
      "the model passes it as nn.TransformerEncoder's src_key_padding_mask, where True means 'ignore this key': every "
      "real token is masked out, attention only reads the padding, and the [CLS] output knows nothing of the ticket",
      r"key_padding_mask|padding[_ ]mask|attention[_ ]mask\W+(\w+\W+){0,10}(invert|revers|flip|opposite|true (means|for|=))|"
      r"(invert|revers|flip|negat)\w*\W+(\w+\W+){0,6}mask|"
      r"(mask\w*)\W+(\w+\W+){0,8}(real|actual|non-?pad\w*) tokens\W+(\w+\W+){0,6}(ignored|masked|hidden)|"
      r"(attend|attention)\w*\W+(\w+\W+){0,6}(only|just)\W+(\w+\W+){0,3}(pad|padding)")
def ticket_padding_mask_inverted(fixed: bool = False):
    seed(0)
    x, y = keyword_tickets(1600, 61)
    xv, yv = keyword_tickets(512, 62)
    model = TicketEncoder()
    collate = ticket_collate(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(Rows(x, y), 32, collate_fn=collate),
                val_loader=loader(Rows(xv, yv), 128, shuffle=False, collate_fn=collate),
                loss_fn=ticket_loss, max_steps=500)


fix("ticket_padding_mask_inverted", fixed_of(ticket_padding_mask_inverted),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val accuracy", steps=200)

# --------------------------------------------------------------------------------------------------------------------
# 2. Log-session classifier whose collate_fn truncates sessions to their first 32 events; the outcome is logged last.

TRUNC = 32


def log_sessions(n: int, s: int, n_outcomes: int = 5):
    """Event ids 1..40; the last event is the outcome (41..45) and the label. 80% of sessions are 40-90 events long."""
    g = gen(s)
    seqs, labels = [], []
    for _ in range(n):
        long = bool(torch.rand(1, generator=g) < 0.8)
        length = int(torch.randint(40, 91, (1,), generator=g)) if long else int(torch.randint(8, 31, (1,), generator=g))
        y = int(torch.randint(0, n_outcomes, (1,), generator=g))
        seq = torch.randint(1, 41, (length,), generator=g)
        seq[-1] = 41 + y
        seqs.append(seq)
        labels.append(y)
    return seqs, torch.tensor(labels)


def session_collate(fixed: bool):
    def collate(batch):
        seqs, labels = zip(*batch)
        tokens = torch.full((len(seqs), TRUNC), PAD, dtype=torch.long)
        for i, s in enumerate(seqs):
            s = s[-TRUNC:] if fixed else s[:TRUNC]      # truncate to the model's max length
            tokens[i, :len(s)] = s
        return tokens, torch.stack(list(labels))
    return collate


class SessionBag(nn.Module):
    def __init__(self, vocab: int = 46, d: int = 32, n_classes: int = 5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=PAD)
        self.mlp = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, n_classes))

    def forward(self, tokens):
        keep = (tokens != PAD).unsqueeze(-1).float()
        return self.mlp((self.emb(tokens) * keep).sum(1) / keep.sum(1).clamp(min=1))


@case("log_sessions_truncated_to_head", "data",
      "the collate_fn truncates every session to its first 32 events (s[:32]), but the outcome the label comes from is "
      "logged as the last event: for the 80% of sessions longer than 32 events the only informative token is cut off",
      r"truncat\w*|(first|head|beginning)\W+(\w+\W+){0,6}(32|max_?len\w*|tokens|events)\W+(\w+\W+){0,10}(cut|drop|lose|remov|discard)|"
      r"(cut|drop|lose|loses|remov|discard)\w*\W+(\w+\W+){0,8}(end|tail|last)\W+(\w+\W+){0,4}(of )?(the )?(sequence|session|text|events?)|"
      r"(keep|take)\w*\W+(\w+\W+){0,4}(last|tail|end)|\[\s*-\s*\w+\s*:\s*\]|truncation_side")
def log_sessions_truncated_to_head(fixed: bool = False):
    seed(0)
    x, y = log_sessions(2000, 63)
    xv, yv = log_sessions(500, 64)
    collate = session_collate(fixed)
    model = SessionBag()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(Rows(x, y), 32, collate_fn=collate),
                val_loader=loader(Rows(xv, yv), 125, shuffle=False, collate_fn=collate),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("log_sessions_truncated_to_head", fixed_of(log_sessions_truncated_to_head),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# 3. Clickstream classifier streamed from an export sorted by label through an IterableDataset with a 16-row shuffle
#    buffer (the tf.data habit): batches are single-class runs and the run ends on the last class.


def clickstream_rows(n_per_class: int, s: int, d: int = 10, n_classes: int = 4):
    g = gen(s)
    centers = 0.6 * torch.randn(n_classes, d, generator=gen(65))
    y = torch.arange(n_classes).repeat_interleave(n_per_class)      # the export is ORDER BY segment
    x = centers[y] + torch.randn(len(y), d, generator=g)
    return x, y


class BufferedStream(IterableDataset):
    """Reads rows in file order and yields them through a shuffle buffer of ``buffer_size`` rows."""

    def __init__(self, x, y, buffer_size: int, s: int = 0):
        self.x, self.y, self.buffer_size, self.s = x, y, buffer_size, s
        self.epoch = 0

    def __iter__(self):
        rng = random.Random(self.s + self.epoch)
        self.epoch += 1
        buf = []
        for i in range(len(self.y)):
            buf.append(i)
            if len(buf) >= self.buffer_size:
                j = buf.pop(rng.randrange(len(buf)))
                yield self.x[j], self.y[j]
        rng.shuffle(buf)
        for j in buf:
            yield self.x[j], self.y[j]

    def __len__(self):
        return len(self.y)


@case("clickstream_sorted_export_small_shuffle_buffer", "data",
      "the training rows are streamed from an export sorted by segment through an IterableDataset with a 16-row "
      "shuffle buffer: each batch holds one or two segments, the model chases the current segment and every epoch "
      "ends on the last one, which it then predicts for almost everything",
      r"(sorted|ordered|grouped)\W+(\w+\W+){0,8}(label|class|segment|target)|"
      r"shuffle[_ ]?buffer|buffer[_ ]?size|(buffer)\W+(\w+\W+){0,6}(small|too small|16)|"
      r"(poorly|insufficiently|barely|locally|partially) shuffled|(label|class|segment)[- ](sorted|ordered)")
def clickstream_sorted_export_small_shuffle_buffer(fixed: bool = False):
    seed(0)
    x, y = clickstream_rows(1200, 66)
    xv, yv = clickstream_rows(200, 67)
    stream = BufferedStream(x, y, buffer_size=len(y) if fixed else 16)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=DataLoader(stream, batch_size=32),
                val_loader=loader(TensorDataset(xv, yv), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("clickstream_sorted_export_small_shuffle_buffer", fixed_of(clickstream_sorted_export_small_shuffle_buffer),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)

# --------------------------------------------------------------------------------------------------------------------
# 4. Store-sales regressor whose store codes come from np.unique(..., return_inverse=True) run separately on the
#    validation period, where three stores are closed: every later store's code shifts.

N_STORES = 30
CLOSED = (3, 11, 17)


def store_sales(n: int, s: int, closed=()):
    g = gen(s)
    effect = 1.2 * torch.randn(N_STORES, generator=gen(68))
    open_stores = torch.tensor([k for k in range(N_STORES) if k not in closed])
    store = open_stores[torch.randint(0, len(open_stores), (n,), generator=g)]
    dow = torch.randint(0, 7, (n,), generator=g)
    promo = (torch.rand(n, generator=g) < 0.3).float()
    sales = 5.0 + effect[store] + 0.6 * promo + 0.3 * torch.sin(dow * 0.9) + 0.2 * torch.randn(n, generator=g)
    names = np.array([f"store_{k:02d}" for k in store.tolist()])
    return names, dow, promo, sales


def store_codes(names, vocabulary=None):
    if vocabulary is None:
        return np.unique(names, return_inverse=True)[1]              # codes of this split's own sorted stores
    return np.searchsorted(vocabulary, names)


def store_table(names, dow, promo, codes):
    return torch.stack([torch.as_tensor(codes, dtype=torch.float32), dow.float(), promo], 1)


class StoreSalesNet(nn.Module):
    def __init__(self, d: int = 8):
        super().__init__()
        self.store = nn.Embedding(N_STORES, d)
        self.mlp = nn.Sequential(nn.Linear(d + 8, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, table):
        store = self.store(table[:, 0].long())
        dow = F.one_hot(table[:, 1].long(), 7).float()
        return 5.0 + self.mlp(torch.cat([store, dow, table[:, 2:3]], 1)).squeeze(-1)


@case("store_sales_codes_encoded_per_split", "data",
      "the store names are turned into embedding ids with np.unique(..., return_inverse=True) separately on the "
      "training and the validation rows; three stores are closed in the validation period, so from the fourth store "
      "on every validation id points at another store's embedding",
      r"(encod|code|id|index|vocab|categor|mapping|label ?encod)\w*\W+(\w+\W+){0,10}(separately|per split|each split|"
      r"independently|refit|re-?fit|again)|(train|training)\W+(\w+\W+){0,6}(and|vs\.?) (val|validation|test)\w*\W+(\w+\W+){0,8}"
      r"(different|inconsistent|mismatch\w*|shifted) (codes|ids|mapping|encoding|categories|vocab)|"
      r"(val|validation|test)\w*\W+(\w+\W+){0,8}(encod\w*|mapp\w*|codes|ids)\W+(\w+\W+){0,6}(different|inconsistent|mismatch\w*|shifted)|"
      r"different (mapping|encoding|codes|ids|vocabulary) (than|from) (the )?train|"
      r"np\.unique|return_inverse|factori[sz]e|cat\.codes|(codes|ids)\W+(\w+\W+){0,4}shift")
def store_sales_codes_encoded_per_split(fixed: bool = False):
    seed(0)
    tr = store_sales(3000, 69)
    va = store_sales(800, 70, closed=CLOSED)
    vocabulary = np.unique(tr[0])
    x = store_table(*tr[:3], store_codes(tr[0]))
    xv = store_table(*va[:3], store_codes(va[0], vocabulary if fixed else None))
    model = StoreSalesNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x, tr[3]), 64),
                val_loader=loader(TensorDataset(xv, va[3]), 200, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=500)


fix("store_sales_codes_encoded_per_split", fixed_of(store_sales_codes_encoded_per_split),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", steps=300, higher=False)

# --------------------------------------------------------------------------------------------------------------------
# 5. Smart-meter customer-type classifier whose Dataset z-normalises each day on its own: the level that separates
#    households from shops, offices and plants is divided away.

LEVELS = torch.tensor([0.5, 1.5, 4.0, 10.0])


def meter_days(n: int, s: int):
    """48 half-hourly kWh readings: the same two-peak daily shape for every type (peak times and heights vary per
    day), scaled by the type's level."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    t = torch.arange(48, dtype=torch.float32)
    p1 = 16 + 3 * torch.rand(n, 1, generator=g)
    p2 = 36 + 4 * torch.rand(n, 1, generator=g)
    h2 = 0.5 + torch.rand(n, 1, generator=g)
    shape = 0.3 + torch.exp(-(t - p1) ** 2 / 8) + h2 * torch.exp(-(t - p2) ** 2 / 10)
    level = LEVELS[y][:, None] * torch.exp(0.25 * torch.randn(n, 1, generator=g))
    return level * shape * torch.exp(0.1 * torch.randn(n, 48, generator=g)), y


class MeterDays(Dataset):
    def __init__(self, x, y, mean=None, std=None):
        self.x, self.y, self.mean, self.std = x, y, mean, std

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        day = self.x[i]
        if self.mean is None:
            day = (day - day.mean()) / (day.std() + 1e-6)   # "standardise every sample"
        else:
            day = (day - self.mean) / self.std
        return day, self.y[i]


@case("meter_days_normalised_per_sample", "data",
      "the Dataset z-normalises each 48-reading day by its own mean and standard deviation: the consumption level, "
      "the only thing that tells households, shops, offices and plants apart (they share the daily shape), is "
      "removed from every sample before the model sees it",
      r"(normali[sz]|standardi[sz]|z-?scor|scal)\w*\W+(\w+\W+){0,8}(its|their|own) (own )?(mean|statistics|stats|std|standard deviation)|"
      r"(per|each|every|individual\w*|own)[- ](\w+[- ])?(sample|window|day|series|row|instance)\W+(\w+\W+){0,10}(normali[sz]|standardi[sz]|z-?scor|scal)|"
      r"(normali[sz]|standardi[sz]|z-?scor|scal)\w*\W+(\w+\W+){0,10}(per|each|every|individual\w*)[- ](\w+[- ])?(sample|window|day|series|row|instance)|"
      r"instance[- ]norm|(level|scale|amplitude|magnitude)\W+(\w+\W+){0,8}(removed|divided away|lost|erased|normali[sz]ed away)|"
      r"(global|dataset|training[- ]set) (mean|statistics|scaler|std)")
def meter_days_normalised_per_sample(fixed: bool = False):
    seed(0)
    x, y = meter_days(1600, 71)
    xv, yv = meter_days(512, 72)
    mean, std = (x.mean(), x.std()) if fixed else (None, None)
    model = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(MeterDays(x, y, mean, std), 32),
                val_loader=loader(MeterDays(xv, yv, mean, std), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("meter_days_normalised_per_sample", fixed_of(meter_days_normalised_per_sample),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)


