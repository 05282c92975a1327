"""Shapes: a batch/time or batch/feature axis mixed up somewhere between the tokens and the loss; nothing raises."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ao.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    keyword_texts,
    loader,
    order_texts,
    rmse_of,
    seed,
)


def _argmax(m, b):
    return m(b[0]).argmax(-1), b[-1]


# --- 1. nn.LSTM left time-major while the batches are batch-major -----------------------------------------------
class ReviewLSTM(nn.Module):
    def __init__(self, vocab, n_classes, batch_first):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32, padding_idx=0)
        self.lstm = nn.LSTM(32, 48, batch_first=batch_first)
        self.head = nn.Linear(48, n_classes)

    def forward(self, tokens):                      # tokens: (batch, seq)
        out, _ = self.lstm(self.emb(tokens))
        return self.head(out[:, -1])                # "last time step"


@case("shapes_lstm_batch_first_missing", "shapes",
      bug="The review classifier feeds (batch, seq, emb) tensors to an nn.LSTM built without batch_first=True, so the "
          "LSTM runs along the batch axis and out[:, -1] mixes other reviews instead of giving each review's last "
          "time step.",
      cause_pattern=r"batch_first|(LSTM|RNN).{0,80}(\(seq(_len)?, ?batch|time[- ]major|seq(uence)?[- ]first)|"
                    r"\(seq(_len)?, ?batch.{0,80}(LSTM|RNN)|runs? along the batch|"
                    r"(batch|sequence|time) (axis|dim(ension)?)s? (is |are )?(swapped|transposed|confused|mixed)")
def lstm_batch_first_missing(fixed=False):
    seed(0)
    x, y, _ = keyword_texts(1600, 20, 60, 4, s=1)
    model = ReviewLSTM(60, 4, batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("shapes_lstm_batch_first_missing", fixed_of(lstm_batch_first_missing), acc_of(_argmax), "val accuracy",
    steps=250)


# --- 2. TextCNN: .view() instead of .transpose() before Conv1d -----------------------------------------------------
class TextCNN(nn.Module):
    def __init__(self, vocab, fixed):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(vocab, 16, padding_idx=0)
        self.conv = nn.Conv1d(16, 64, kernel_size=2)
        self.head = nn.Linear(64, 2)

    def forward(self, tokens):
        e = self.emb(tokens)                                     # (B, T, E)
        b, t, d = e.shape
        e = e.transpose(1, 2) if self.fixed else e.view(b, d, t)  # Conv1d wants (B, E, T)
        return self.head(F.relu(self.conv(e)).amax(-1))


@case("shapes_textcnn_view_not_transpose", "shapes",
      bug="The TextCNN turns its (batch, seq, emb) embeddings into Conv1d's (batch, channels, seq) with "
          ".view(b, emb, seq) instead of .transpose(1, 2), so each conv channel reads a scrambled slice of several "
          "tokens' embedding values and the word-order signal is lost.",
      cause_pattern=r"view\(b, ?emb, ?seq\)|view.{0,80}(Conv1d|conv|channel)|(Conv1d|conv|channel).{0,80}\.view|transpose\(1, ?2\)|"
                    r"(view|reshape)\w* .{0,40}(instead of|rather than|not) (a )?(transpos|permut)|reinterpret\w* the memory")
def textcnn_view_not_transpose(fixed=False):
    seed(0)
    x, y = order_texts(2400, 40, 40, s=2)
    model = TextCNN(40, fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("shapes_textcnn_view_not_transpose", fixed_of(textcnn_view_not_transpose), acc_of(_argmax), "val accuracy",
    steps=300)


# --- 3. hand-written decoder loop: outputs stacked time-major, targets batch-major --------------------------------
K3 = 7


def running_sum_pairs(n, length, s):
    """Transducer data: target y_t = (x_t + y_{t-1}) mod K3; decoder input = BOS (=K3) then y_{<t}."""
    g = gen(s)
    src = torch.randint(0, K3, (n, length), generator=g)
    tgt = torch.cumsum(src, 1) % K3
    dec_in = torch.cat([torch.full((n, 1), K3), tgt[:, :-1]], 1)
    return src, dec_in, tgt


class StepDecoder(nn.Module):
    """Teacher-forced GRU decoder run step by step (as in the classic seq2seq tutorial)."""

    def __init__(self, stack_dim):
        super().__init__()
        self.stack_dim = stack_dim
        self.src_emb = nn.Embedding(K3, 16)
        self.tgt_emb = nn.Embedding(K3 + 1, 16)
        self.cell = nn.GRUCell(32, 64)
        self.out = nn.Linear(64, K3)

    def forward(self, src, dec_in):
        h = src.new_zeros(src.shape[0], 64, dtype=torch.float)
        steps = []
        for t in range(src.shape[1]):
            h = self.cell(torch.cat([self.src_emb(src[:, t]), self.tgt_emb(dec_in[:, t])], -1), h)
            steps.append(self.out(h))
        return torch.stack(steps, dim=self.stack_dim)


def seq_ce(model, batch):
    src, dec_in, tgt = batch
    logits = model(src, dec_in)
    return F.cross_entropy(logits.reshape(-1, K3), tgt.reshape(-1))


@case("shapes_decoder_steps_stacked_time_major", "shapes",
      bug="The step-by-step decoder collects its per-step logits with torch.stack(steps) (dim=0, time-major "
          "(seq, batch, vocab)) while the targets are batch-major (batch, seq), so logits.reshape(-1, V) and "
          "tgt.reshape(-1) pair each prediction with another sequence's token.",
      cause_pattern=r"torch\.stack|stack\w*\(.{0,30}dim|(logits|outputs?|predictions?) (are |is )?(time|step)[- ]major|"
                    r"(time|step)[- ]major (logits|outputs?)|stack\w*.{0,40}(dim ?= ?0|along (the )?(time|step|first))")
def decoder_steps_stacked_time_major(fixed=False):
    seed(0)
    src, dec_in, tgt = running_sum_pairs(1500, 10, s=3)
    model = StepDecoder(stack_dim=1 if fixed else 0)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(src[:1200], dec_in[:1200], tgt[:1200]), 32),
                val_loader=loader(TensorDataset(src[1200:], dec_in[1200:], tgt[1200:]), 100, shuffle=False),
                loss_fn=seq_ce, max_steps=500)


def _dec_pred(m, b):
    logits = m(b[0], b[1])
    if m.stack_dim == 0:
        logits = logits.transpose(0, 1)
    return logits.argmax(-1), b[2]


fix("shapes_decoder_steps_stacked_time_major", fixed_of(decoder_steps_stacked_time_major), acc_of(_dec_pred),
    "val token accuracy", steps=250)


# --- 4. BiLSTM final hidden state h_n.view(batch, -1) -------------------------------------------------------------
class BiLSTMIntent(nn.Module):
    def __init__(self, vocab, n_classes, fixed):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(vocab, 32, padding_idx=0)
        self.lstm = nn.LSTM(32, 32, batch_first=True, bidirectional=True)
        self.head = nn.Linear(64, n_classes)

    def forward(self, tokens):
        _, (h, _) = self.lstm(self.emb(tokens))          # h: (2, batch, 32)
        if self.fixed:
            feat = torch.cat([h[-2], h[-1]], dim=1)
        else:
            feat = h.view(tokens.shape[0], -1)
        return self.head(feat)


@case("shapes_bilstm_hidden_view", "shapes",
      bug="The intent classifier flattens the bidirectional LSTM's final hidden state h_n, shaped (num_directions, "
          "batch, hidden), with h.view(batch, -1), which puts other utterances' states into each row instead of "
          "concatenating h_n[-2] and h_n[-1] per utterance.",
      cause_pattern=r"h_n|h\.view|hidden\.view|(final|last) hidden.{0,80}(view|reshape|mix|batch)|"
                    r"num_directions|(direction|layer)s?, ?batch|cat\(\[?h\w*\[-2\]|permute\(1, ?0")
def bilstm_hidden_view(fixed=False):
    seed(0)
    x, y, _ = keyword_texts(1600, 16, 50, 5, s=4)
    model = BiLSTMIntent(50, 5, fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=500)


fix("shapes_bilstm_hidden_view", fixed_of(bilstm_hidden_view), acc_of(_argmax), "val accuracy", steps=250)


# --- 5. sentence-similarity regression: (B, 1) predictions against (B,) scores -----------------------------------
class PairScorer(nn.Module):
    def __init__(self, vocab, fixed):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.EmbeddingBag(vocab, 32, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, pair):                         # pair: (B, 2, T) token ids of the two sentences
        a, b = self.emb(pair[:, 0]), self.emb(pair[:, 1])
        out = self.mlp(torch.cat([a * b, (a - b).abs()], -1))
        return out.squeeze(-1) if self.fixed else out


def sts_pairs(n, s):
    g = gen(s)
    vocab, t = 40, 8
    a = torch.randint(0, vocab, (n, t), generator=g)
    b = torch.randint(0, vocab, (n, t), generator=g)
    keep = torch.rand(n, 1, generator=g)
    share = torch.rand(n, t, generator=g) < keep
    b = torch.where(share, a, b)
    score = 5.0 * share.float().mean(1)              # 0-5 similarity, like STS-B
    return torch.stack([a, b], 1), score


@case("shapes_sts_mse_broadcast", "shapes",
      bug="The sentence-similarity regressor outputs (24, 1) scores and MSELoss compares them with the (24,) gold "
          "scores of the batch, which broadcasts to a (24, 24) matrix so the model only learns the mean similarity.",
      cause_pattern=r"\(24, ?1\)|\(24, ?24\)|\[24, ?1\]|MSELoss.{0,100}broadcast|broadcast.{0,100}MSELoss|"
                    r"(similarity|sts|gold score).{0,100}broadcast|broadcast.{0,100}(similarity|sts|gold score)|"
                    r"mean similarity")
def sts_mse_broadcast(fixed=False):
    seed(0)
    x, y = sts_pairs(2000, s=5)
    model = PairScorer(40, fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 24),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=500)


def _sts_pred(m, b):
    return m(b[0]).reshape(-1), b[1]


fix("shapes_sts_mse_broadcast", fixed_of(sts_mse_broadcast), rmse_of(_sts_pred), "val RMSE", steps=250,
    higher=False)
