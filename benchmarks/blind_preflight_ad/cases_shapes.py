"""Shapes: tensors laid out along the wrong axis, silently accepted by the layer or the loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from .registry import acc_of, case, first_arg, fix, fixed_of, gen, loader, seed

# --- S1: a GRU left seq-first (batch_first=False) fed (batch, time, features) windows -----------------------------

def _sensor_windows(n, s):
    g = gen(s)
    t = 24
    x = torch.randn(n, t, 4, generator=g) * 0.5
    label = torch.randint(0, 3, (n,), generator=g)
    # the class sets which third of the window carries a bump on channel 0
    for c in range(3):
        idx = label == c
        x[idx, c * 8:(c + 1) * 8, 0] += 1.5
    return x, label


class SensorGRU(nn.Module):
    def __init__(self, batch_first):
        super().__init__()
        self.rnn = nn.GRU(4, 32, batch_first=batch_first)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])  # "last time step"


@case("shapes_gru_seq_first_fed_batch_first", "shapes",
      bug="nn.GRU is built with the default batch_first=False but the windows are (batch, time, features): the GRU "
          "runs along the batch axis (mixing different samples as time steps) and out[:, -1] is the last sample's "
          "hidden state at every step, not each window's last time step",
      cause_pattern=r"(GRU|LSTM|RNN|recurrent)[^.]{0,80}batch_first|batch_first[^.]{0,80}(GRU|LSTM|RNN|recurrent)|"
                    r"expects? \(seq(_len)?, ?batch|(runs?|iterat\w*|recur\w*) (along|over) the batch (axis|dim\w*)|"
                    r"batch (axis|dim\w*) (is )?(treated|read|used) as (the )?(time|sequence)|mix\w* (different )?samples as time steps")
def shapes_gru_seq_first_fed_batch_first(fixed=False):
    seed(0)
    x, y = _sensor_windows(1536, 1)
    xv, yv = _sensor_windows(512, 2)
    model = SensorGRU(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("shapes_gru_seq_first_fed_batch_first", fixed_of(shapes_gru_seq_first_fed_batch_first), acc_of(first_arg), "val accuracy")


# --- S2: log_softmax over the batch axis before NLLLoss --------------------------------------------------------------

class ChurnNet(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.body = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return F.log_softmax(self.body(x), dim=self.dim)


def _churn(n, s):
    g = gen(s)
    x = torch.randn(n, 12, generator=g)
    w = torch.randn(12, 4, generator=gen(99))
    b = torch.tensor([2.0, 0.0, -1.0, -1.5])  # unequal class frequencies
    return x, (x @ w + b).argmax(1)


@case("shapes_log_softmax_over_batch_axis", "shapes",
      bug="the model ends in F.log_softmax(logits, dim=0), normalising each class column over the samples of the "
          "batch instead of over the classes (dim=1), and NLLLoss then trains those batch-normalised scores",
      cause_pattern=r"(log_?softmax|softmax)[^.]{0,80}(dim\s*=\s*0|over the batch|across the batch|batch (axis|dim)|"
                    r"wrong (axis|dim))|(over|across) the batch (axis|dimension) instead of (the )?class|"
                    r"do not sum to (1|one) over (the )?classes|dim\s*=\s*(1|-1)\b[^.]{0,40}class")
def shapes_log_softmax_over_batch_axis(fixed=False):
    seed(0)
    x, y = _churn(2048, 3)
    xv, yv = _churn(512, 4)
    model = ChurnNet(dim=1 if fixed else 0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 8, shuffle=False),
                loss_fn=nn.NLLLoss(), max_steps=300)


fix("shapes_log_softmax_over_batch_axis", fixed_of(shapes_log_softmax_over_batch_axis), acc_of(first_arg), "val accuracy")


# --- S3: token logits (B, T, C) reshaped with .view(B, C, T) for CrossEntropyLoss instead of permuted --------------

VOCAB, TAGS, SEQ = 40, 5, 16


def _tag_data(n, s):
    g = gen(s)
    x = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    table = torch.randint(0, TAGS, (VOCAB,), generator=gen(7))
    return x, table[x]


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1)
        self.out = nn.Linear(32, TAGS)

    def forward(self, x):
        return self.out(self.enc(self.emb(x)))  # (B, T, C)


def _tag_loss(fixed):
    def tag_loss(model, batch):
        x, y = batch
        logits = model(x)
        b, t, c = logits.shape
        scores = logits.permute(0, 2, 1) if fixed else logits.view(b, c, t)  # CrossEntropyLoss wants (B, C, T)
        return F.cross_entropy(scores, y)
    return tag_loss


@case("shapes_token_logits_view_not_permute", "shapes",
      bug="the tagger's (batch, time, classes) logits are given to cross_entropy as logits.view(B, C, T) to get the "
          "(B, C, T) layout it asks for: view reinterprets the memory instead of moving the class axis "
          "with permute(0, 2, 1), so each 'class score' mixes positions and classes",
      cause_pattern=r"\.?view\([^)]*\)[^.]{0,80}(instead of|rather than|not)[^.]{0,20}(permute|transpose)|"
                    r"permute\(0, ?2, ?1\)|view (does not|doesn't|cannot) (move|swap|reorder)|"
                    r"reinterpret\w* (the )?memory|scrambl\w* (the )?(class|time|axes)")
def shapes_token_logits_view_not_permute(fixed=False):
    seed(0)
    x, y = _tag_data(2048, 5)
    xv, yv = _tag_data(256, 6)
    model = Tagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 64, shuffle=False),
                loss_fn=_tag_loss(fixed), max_steps=300)


fix("shapes_token_logits_view_not_permute", fixed_of(shapes_token_logits_view_not_permute), acc_of(first_arg),
    "val token accuracy")


# --- S4: time-major GRU outputs flattened against batch-major labels ------------------------------------------------

class PosTagger(nn.Module):
    """A seq-first GRU used as documented: (T, B) in, (T, B, C) out."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 24)
        self.rnn = nn.GRU(24, 48)
        self.out = nn.Linear(48, TAGS)

    def forward(self, x):          # x: (B, T)
        h, _ = self.rnn(self.emb(x.t()))
        return self.out(h)         # (T, B, C)


def _pos_loss(fixed):
    def pos_loss(model, batch):
        x, y = batch
        logits = model(x)
        if fixed:
            logits = logits.transpose(0, 1)
        return F.cross_entropy(logits.reshape(-1, TAGS), y.reshape(-1))
    return pos_loss


def _pos_pred(m, b):
    return m(b[0]).transpose(0, 1).argmax(-1), b[1]


@case("shapes_time_major_logits_flattened_against_batch_major_labels", "shapes",
      bug="the seq-first GRU returns (time, batch, classes) logits; the loss flattens them with reshape(-1, C) next "
          "to labels of shape (batch, time) flattened with reshape(-1), so row i of the logits (time-major order) is "
          "scored against the label of another sample and position",
      cause_pattern=r"time[- ]major|\(T, ?B|\(time, ?batch|\(seq(_len)?, ?batch|"
                    r"transpose\(0, ?1\)|permute\(1, ?0|"
                    r"(flatten\w*|reshape\w*)[^.]{0,60}(different|another|wrong|mismatch\w*) (order|layout|sample)")
def shapes_time_major_logits_flattened_against_batch_major_labels(fixed=False):
    seed(0)
    x, y = _tag_data(2048, 8)
    xv, yv = _tag_data(256, 9)
    model = PosTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 64, shuffle=False),
                loss_fn=_pos_loss(fixed), max_steps=300)


fix("shapes_time_major_logits_flattened_against_batch_major_labels",
    fixed_of(shapes_time_major_logits_flattened_against_batch_major_labels), acc_of(_pos_pred), "val token accuracy")


# --- S5: (B, T, C) logits straight into cross_entropy, silent because T == C ---------------------------------------

DAYS = 6       # six forecast days ...
KINDS = 6      # ... and six weather kinds: the same size, so cross_entropy raises nothing


def _weather(n, s):
    """Per-day station readings (n, 6 days, 5 sensors); each day's kind is set by that day's two strongest sensors."""
    g = gen(s)
    x = torch.randn(n, DAYS, 5, generator=g)
    w = torch.randn(5, KINDS, generator=gen(21))
    return x, (x @ w).argmax(-1)                # (n, DAYS)


class DayClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(5, 32, batch_first=True)
        self.out = nn.Linear(32, KINDS)

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.out(h)                      # (B, DAYS, KINDS)


def _weather_loss(fixed):
    def weather_loss(model, batch):
        x, y = batch
        logits = model(x)
        if fixed:
            logits = logits.transpose(1, 2)     # cross_entropy wants the classes on dim 1: (B, C, T)
        return F.cross_entropy(logits, y)
    return weather_loss


def _weather_pred(m, b):
    return m(b[0]).argmax(-1), b[1]


@case("shapes_sequence_logits_class_axis_last", "shapes",
      bug="per-day logits of shape (batch, days, classes) go straight into F.cross_entropy, which reads dim 1 as the "
          "class axis: with 6 days and 6 classes the shapes pass, so the day axis is scored as classes and the "
          "class axis as positions; the logits need .transpose(1, 2) (or reshape to (-1, C) with labels reshape(-1))",
      cause_pattern=r"transpose\(1, ?2\)|class(es)? (axis|dim\w*) (on|at|in|must be|should be|is) "
                    r"(dim(ension)? ?1|the second|position 1)|dim(ension)? ?1 (as|is read as|is taken as|is) (the )?class|"
                    r"\(N, ?C, ?d|(time|day|sequence|position)s? (axis|dim\w*) (is )?(scored|read|treated|taken) as (the )?class")
def shapes_sequence_logits_class_axis_last(fixed=False):
    seed(0)
    x, y = _weather(2048, 12)
    xv, yv = _weather(512, 13)
    model = DayClassifier()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=_weather_loss(fixed), max_steps=300)


fix("shapes_sequence_logits_class_axis_last", fixed_of(shapes_sequence_logits_class_axis_last), acc_of(_weather_pred),
    "val per-day accuracy")
