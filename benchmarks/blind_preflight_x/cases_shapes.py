"""Shapes: tensors laid out differently from what the layer or loss reads, without an error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_x.registry import acc_of, case, fix, fixed_of, gen, loader, mae_of, seed

# --- 1. a text CNN whose Conv1d slides over the embedding dimension -------------------------------------------------


def _bigram_reviews(n, s):
    """Reviews of 20 token ids; positive when token 7 is immediately followed by token 13 (both tokens appear in
    every review, so a bag of words cannot tell)."""
    g = gen(s)
    x = torch.randint(20, 60, (n, 20), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        a = int(torch.randint(0, 19, (1,), generator=g))
        if y[i] == 1:
            x[i, a], x[i, a + 1] = 7, 13
        else:
            b = int(torch.randint(0, 20, (1,), generator=g))
            while b == a + 1 or b == a:
                b = int(torch.randint(0, 20, (1,), generator=g))
            x[i, a], x[i, b] = 7, 13
    return x, y


class TextCNN(nn.Module):
    def __init__(self, fixed, seq_len=20, emb=16):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(60, emb)
        # the user's first try raised "expected input[32, 20, 16] to have 16 channels"; the "fix" was in_channels=seq_len
        self.conv = nn.Conv1d(emb if fixed else seq_len, 32, kernel_size=2)
        self.out = nn.Linear(32, 2)

    def forward(self, tokens):
        e = self.emb(tokens)                      # (batch, seq_len, emb)
        if self.fixed:
            e = e.permute(0, 2, 1)                # (batch, emb, seq_len): channels first
        h = torch.relu(self.conv(e)).max(dim=2).values
        return self.out(h)


@case("sh_textcnn_conv1d_slides_over_embedding", "shapes",
      bug="The text CNN feeds the (batch, seq_len, emb) embeddings to nn.Conv1d without permute(0, 2, 1) and sets "
          "in_channels=seq_len to silence the channel error, so the convolution slides over the embedding dimension "
          "instead of over the tokens and cannot detect the bigram.",
      cause_pattern=r"(conv1d|convolution).{0,160}(embedding dim|over the (embedding|feature)|channels?[- ]first|"
                    r"in_channels\s*=?\s*(=\s*)?seq_len|sequence length as (the )?channels?)|permute\(0,\s*2,\s*1\)|"
                    r"transpose\(1,\s*2\).{0,80}conv1d|conv1d.{0,120}(expects?|wants?) \(?(n|batch), ?c(hannels)?, ?l")
def sh_textcnn(fixed=False):
    seed(0)
    x, y = _bigram_reviews(2000, 1)
    model = TextCNN(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("sh_textcnn_conv1d_slides_over_embedding", fixed_of(sh_textcnn), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=300)

# --- 2. last time step of pad_packed_sequence output (zeros for the shorter sequences) --------------------------------


def _sessions(n, s):
    """Click sessions of 3..20 item ids (0 = padding); the label is the category of the first item (4 classes)."""
    g = gen(s)
    lengths = torch.randint(3, 21, (n,), generator=g)
    x = torch.randint(1, 41, (n, 20), generator=g)
    x[torch.arange(20).expand(n, 20) >= lengths[:, None]] = 0
    return x, (x[:, 0] - 1) % 4


class SessionGRU(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(41, 24, padding_idx=0)
        self.gru = nn.GRU(24, 48, batch_first=True)
        self.head = nn.Linear(48, 4)

    def forward(self, items):
        lengths = (items != 0).sum(1).cpu()
        packed = pack_padded_sequence(self.emb(items), lengths, batch_first=True, enforce_sorted=False)
        out, h_n = self.gru(packed)
        if self.fixed:
            last = h_n[-1]
        else:
            out, _ = pad_packed_sequence(out, batch_first=True)
            last = out[:, -1, :]                 # "the last output", as with an unpacked batch
        return self.head(last)


@case("sh_packed_gru_takes_padded_last_step", "shapes",
      bug="After pack_padded_sequence / pad_packed_sequence the classifier reads out[:, -1, :], which is the zero "
          "padding for every session shorter than the longest in the batch; the final state of each sequence is "
          "h_n (or out at index lengths - 1).",
      cause_pattern=r"pad_packed_sequence|h_n\b|lengths?\s*-\s*1|last (valid|real|non-pad(ded)?) (time ?step|token|"
                    r"output|position)|out(put)?\[:, ?-1.{0,120}(pad|zero)|(zeros?|padding) (for|at) .{0,60}shorter")
def sh_packed_gru(fixed=False):
    seed(0)
    x, y = _sessions(1800, 2)
    model = SessionGRU(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1400], y[:1400]), 32),
                val_loader=loader(TensorDataset(x[1400:], y[1400:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=250)


fix("sh_packed_gru_takes_padded_last_step", fixed_of(sh_packed_gru),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)

# --- 3. tagger: batch-first logits flattened against seq-first tags ---------------------------------------------------


def _pos_sentences(n, s, length=12):
    g = gen(s)
    x = torch.randint(0, 80, (n, length), generator=g)
    return x, x % 6                              # each word has one tag


def seq_first_collate(items):
    """The collate copied from a torchtext-era tutorial: tags come out (seq_len, batch)."""
    words = torch.stack([w for w, _ in items])
    tags = torch.stack([t for _, t in items]).t().contiguous()
    return words, tags


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(80, 32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 6))

    def forward(self, words):
        return self.mlp(self.emb(words))          # (batch, seq_len, tags)


def tagger_loss(fixed):
    def loss_fn(model, batch):
        words, tags = batch
        logits = model(words)
        if fixed:
            tags = tags.t()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tags.reshape(-1))
    return loss_fn


@case("sh_tagger_seq_first_tags_flattened", "shapes",
      bug="The collate returns the tags as (seq_len, batch) while the tagger's logits are (batch, seq_len, tags); "
          "the loss flattens both with reshape(-1), so each token's logits are scored against another token's tag.",
      cause_pattern=r"(seq_len, ?batch|seq(uence)?[- ]first|time[- ]major).{0,200}(batch, ?seq_len|batch[- ]first)|"
                    r"(batch[- ]first).{0,200}(seq[- ]first|\(seq_len, ?batch)|tags?\.t\(\)|transpose.{0,60}(tags?|"
                    r"labels?|targets?)|(tags?|labels?|targets?).{0,80}(transposed|misaligned|another token)")
def sh_tagger(fixed=False):
    seed(0)
    x, y = _pos_sentences(1500, 3)
    model = Tagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(list(zip(x[:1200], y[:1200])), 32, collate_fn=seq_first_collate),
                val_loader=loader(list(zip(x[1200:], y[1200:])), 100, shuffle=False, collate_fn=seq_first_collate),
                loss_fn=tagger_loss(fixed), max_steps=200)


fix("sh_tagger_seq_first_tags_flattened", fixed_of(sh_tagger),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1].t())), "val token accuracy", steps=200)

# --- 4. nn.MultiheadAttention left seq-first, fed batch-first -------------------------------------------------------


def _speaker_turns(n, s):
    """Turns of 10 tokens; token 0 is the speaker id (20 speakers) and every position is tagged with it."""
    g = gen(s)
    x = torch.randint(0, 20, (n, 10), generator=g)
    return x, x[:, :1].expand(n, 10).clone()


class SpeakerTagger(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.tok = nn.Embedding(20, 32)
        self.pos = nn.Embedding(10, 32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=fixed)
        self.norm = nn.LayerNorm(32)
        self.out = nn.Linear(32, 20)

    def forward(self, x):
        h = self.tok(x) + self.pos(torch.arange(x.size(1), device=x.device))
        a, _ = self.attn(h, h, h)                # h is (batch, seq, emb)
        return self.out(self.norm(h + a))


def token_ce(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


@case("sh_mha_default_seq_first_fed_batch_first", "shapes",
      bug="nn.MultiheadAttention is built with its default batch_first=False but called on (batch, seq, emb) "
          "tensors, so each token attends over the other sequences of the batch at the same position instead of "
          "over its own sequence.",
      cause_pattern=r"batch_first|\(seq(_len)?, ?batch, ?(emb|embed|e)\w*\)|(attend|attention)\w* (over|across) "
                    r"(the )?(batch|other (sequences|samples|examples))|(seq(uence)?[- ]first).{0,80}attention")
def sh_mha(fixed=False):
    seed(0)
    x, y = _speaker_turns(1600, 4)
    model = SpeakerTagger(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1300], y[:1300]), 32),
                val_loader=loader(TensorDataset(x[1300:], y[1300:]), 100, shuffle=False),
                loss_fn=token_ce, max_steps=250)


fix("sh_mha_default_seq_first_fed_batch_first", fixed_of(sh_mha),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val token accuracy", steps=250)

# --- 5. hand-written pinball loss broadcasting (batch, 1) against (batch,) -------------------------------------------


def _demand(n, s):
    g = gen(s)
    lags = torch.randn(n, 7, generator=g)
    promo = torch.randint(0, 2, (n, 1), generator=g).float()
    x = torch.cat([lags, promo], 1)
    y = 3 * lags[:, 0] - 2 * lags[:, 1] + lags[:, 6] * lags[:, 2] + 2.5 * promo[:, 0] + 0.3 * torch.randn(n, generator=g)
    return x, y


class MedianForecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x)                        # (batch, 1)


def pinball(fixed, q=0.5):
    def loss_fn(model, batch):
        x, y = batch                              # y: (batch,)
        pred = model(x)
        if fixed:
            pred = pred.squeeze(-1)
        err = y - pred
        return torch.maximum(q * err, (q - 1) * err).mean()
    return loss_fn


@case("sh_pinball_loss_broadcasts_batch_by_batch", "shapes",
      bug="The hand-written pinball (quantile) loss subtracts the (batch, 1) predictions from the (batch,) demand "
          "targets, which broadcasts to a (batch, batch) error matrix: every forecast is pulled toward the median of "
          "the whole batch and the features are ignored.",
      cause_pattern=r"(pinball|quantile).{0,200}(broadcast|\((batch|n|b|\d+), ?(batch|n|b|\d+)\)|unsqueeze|squeeze|"
                    r"whole batch|every (forecast|prediction))|broadcast.{0,200}(pinball|quantile)")
def sh_pinball(fixed=False):
    seed(0)
    x, y = _demand(2000, 5)
    model = MedianForecaster()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=pinball(fixed), max_steps=300)


fix("sh_pinball_loss_broadcasts_batch_by_batch", fixed_of(sh_pinball),
    mae_of(lambda m, b: (m(b[0]).squeeze(-1), b[1])), "val MAE", steps=300, higher=False)
