"""Set ac, family shapes: a tensor laid out differently from what the code assumes, silently."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ac.registry import acc_of, case, fix, fixed_of, gen, loader, seed

# --- sensor windows, LSTM without batch_first ---------------------------------------------------------------

def sensor_windows(n, s):
    """(n, 20, 3) accelerometer-like windows; class = sign/size of the drift of channel 0 over the window."""
    g = gen(s)
    t = torch.arange(20).float()
    slope = torch.randn(n, 1, generator=g)
    level = 2.0 * torch.randn(n, 1, generator=g)
    x0 = level + slope * (t - 9.5) / 5 + 0.3 * torch.randn(n, 20, generator=g)
    x1 = torch.randn(n, 20, generator=g)
    x2 = torch.sin(t / 3 + 6 * torch.rand(n, 1, generator=g))
    y = torch.bucketize(slope.squeeze(1), torch.tensor([-0.45, 0.45]))
    return torch.stack([x0, x1, x2], -1), y


class DriftLSTM(nn.Module):
    def __init__(self, batch_first):
        super().__init__()
        self.lstm = nn.LSTM(3, 32, batch_first=batch_first)
        self.head = nn.Linear(32, 3)

    def forward(self, x):           # x: (batch, time, features) from the DataLoader
        out, _ = self.lstm(x)
        return self.head(out[:, -1, :])   # "last time step", written for batch_first=True


@case("lstm_missing_batch_first", "shapes",
      bug="nn.LSTM is built without batch_first=True but fed (batch, time, features) windows and read as "
          "out[:, -1, :]: the LSTM runs its recurrence across the samples of the batch (dim 0 taken as time) and "
          "each prediction sees only the last time step of the samples, so the drift over time cannot be learned.",
      cause_pattern=r"batch_first|(batch|sample)s?\W.{0,60}(treated|taken|read|interpreted|used) as (the )?"
                    r"(time|sequence|seq)|recurren\w+ (runs )?(across|over) the (batch|samples)|"
                    r"\(seq(_len)?, ?batch")
def lstm_missing_batch_first(fixed=False):
    seed(0)
    x, y = sensor_windows(1600, 1)
    model = DriftLSTM(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("lstm_missing_batch_first", fixed_of(lstm_missing_batch_first),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)


# --- channels-last tiles reshaped instead of permuted --------------------------------------------------------

def color_tiles(n, s):
    """(n, 12, 12, 3) channels-last tiles, as a numpy/PIL pipeline gives them; class = colour of a 4x4 spot."""
    g = gen(s)
    x = 0.4 * torch.randn(n, 12, 12, 3, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    r = torch.randint(0, 9, (n,), generator=g)
    c = torch.randint(0, 9, (n,), generator=g)
    for i in range(n):
        x[i, r[i]:r[i] + 4, c[i]:c[i] + 4, :] += 0.4
        x[i, r[i]:r[i] + 4, c[i]:c[i] + 4, y[i]] += 1.0
    return x, y


class TileCNN(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(16, 3)

    def forward(self, x):           # x: (N, H, W, C)
        if self.fixed:
            x = x.permute(0, 3, 1, 2)
        else:
            x = x.reshape(x.size(0), 3, 12, 12)   # "to NCHW"
        return self.head(self.features(x))


@case("nhwc_reshaped_not_permuted", "shapes",
      bug="Channels-last (N, H, W, C) image batches are turned into (N, C, H, W) with x.reshape(N, 3, 12, 12) "
          "instead of x.permute(0, 3, 1, 2): the pixels are scrambled, colour ends up interleaved along the width "
          "of each 'channel' plane, and the CNN cannot tell the colour of the spot.",
      cause_pattern=r"permute|reshape.{0,80}(instead of|rather than|not).{0,30}(transpos|permut)|"
                    r"(channels?[- ]last|NHWC|\(N, ?H, ?W, ?C\)).{0,120}(reshap|view|scrambl|interleav)|"
                    r"(reshap|view)\w*.{0,120}(NHWC|channels?[- ]last|scrambl|interleav)")
def nhwc_reshaped_not_permuted(fixed=False):
    seed(0)
    x, y = color_tiles(1500, 2)
    model = TileCNN(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1100], y[:1100]), 32),
                val_loader=loader(TensorDataset(x[1100:], y[1100:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


fix("nhwc_reshaped_not_permuted", fixed_of(nhwc_reshaped_not_permuted),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)


# --- per-step labels, seq-first GRU output flattened against batch-first targets ----------------------------

def step_labels(n, s):
    """(n, 16, 4) gait windows with a label per time step: which of the first three channels peaks."""
    g = gen(s)
    x = torch.randn(n, 16, 4, generator=g)
    y = x[..., :3].argmax(-1)
    return x, y


class StepTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 32)          # seq-first, as the tutorial it came from
        self.head = nn.Linear(32, 3)

    def forward(self, x):                 # x: (batch, time, 4)
        out, _ = self.gru(x.transpose(0, 1))
        return self.head(out)             # (time, batch, 3)


def make_step_loss(fixed):
    def step_loss(model, batch):
        x, y = batch
        logits = model(x)                                     # (time, batch, classes)
        if fixed:
            logits = logits.transpose(0, 1)                    # (batch, time, classes), the order of y
        return F.cross_entropy(logits.reshape(-1, 3), y.reshape(-1))
    return step_loss


@case("seq_first_logits_flattened_against_batch_first_labels", "shapes",
      bug="A seq-first GRU tagger returns (time, batch, classes) logits, flattened with .reshape(-1, C) in "
          "time-major order, while the (batch, time) labels are flattened batch-major: each logit row is scored "
          "against another sample's label at another step, so the per-step labels are never aligned.",
      cause_pattern=r"(time|seq\w*)[- ]major|batch[- ]major|\((time|seq\w*|T), ?(batch|B)|"
                    r"(logits?|outputs?|predictions?).{0,80}(flatten|reshape|view).{0,80}(order|align|misalign|"
                    r"transpos)|(misalign|not aligned|out of order).{0,60}(label|target)|"
                    r"(label|target)s?.{0,60}(misalign|not aligned|other sample|wrong (sample|position))")
def seq_first_logits_flattened_against_batch_first_labels(fixed=False):
    seed(0)
    x, y = step_labels(1400, 3)
    model = StepTagger()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1024], y[:1024]), 32),
                val_loader=loader(TensorDataset(x[1024:], y[1024:]), 128, shuffle=False),
                loss_fn=make_step_loss(fixed), max_steps=1500)


fix("seq_first_logits_flattened_against_batch_first_labels",
    fixed_of(seq_first_logits_flattened_against_batch_first_labels),
    acc_of(lambda m, b: (m(b[0]).transpose(0, 1).argmax(-1), b[1])), "val per-step accuracy", steps=300)


# --- mean over the embedding dimension instead of the token dimension -----------------------------------------

MAX_LEN = 24


def topic_docs(n, s, vocab=180, k=4):
    """Token ids (n, 24): filler words 4..99, three words of the document's topic (100 + 20 * topic + 0..19) and
    one word of another topic."""
    g = gen(s)
    y = torch.randint(0, k, (n,), generator=g)
    ids = torch.randint(4, 100, (n, MAX_LEN), generator=g)
    for i in range(n):
        pos = torch.randperm(MAX_LEN, generator=g)[:4]
        ids[i, pos[:3]] = 100 + 20 * y[i] + torch.randint(0, 20, (3,), generator=g)
        other = (y[i] + torch.randint(1, k, (1,), generator=g)) % k
        ids[i, pos[3]] = 100 + 20 * other + torch.randint(0, 20, (1,), generator=g)
    return ids, y


class MeanPoolClassifier(nn.Module):
    def __init__(self, pool_dim, vocab=180, dim=24):
        super().__init__()
        self.pool_dim = pool_dim
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, 4)

    def forward(self, ids):                         # (batch, tokens)
        e = self.embed(ids)                         # (batch, tokens, dim)
        return self.head(e.mean(dim=self.pool_dim))


@case("mean_pooled_over_embedding_dim", "shapes",
      bug="The text classifier averages its (batch, tokens, dim) embeddings with e.mean(dim=2) instead of dim=1: "
          "it runs only because max_len equals the embedding size (24), each token is reduced to one number and "
          "the head reads positions, so the topic words cannot be pooled into a document vector.",
      cause_pattern=r"mean\(dim ?= ?[2-]|(pool|averag|mean)\w*.{0,60}(over|across|along) (the )?(wrong|embedding|"
                    r"feature|hidden|last) (dim|axis)|(embedding|feature|hidden) (dim|axis)\w*.{0,60}(pooled|averaged|"
                    r"reduced|collapsed)|(token|sequence|position) (dim|axis).{0,60}(not|instead|should)")
def mean_pooled_over_embedding_dim(fixed=False):
    seed(0)
    x, y = topic_docs(1800, 4)
    model = MeanPoolClassifier(1 if fixed else 2)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x[:1400], y[:1400]), 32),
                val_loader=loader(TensorDataset(x[1400:], y[1400:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("mean_pooled_over_embedding_dim", fixed_of(mean_pooled_over_embedding_dim),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)


# --- last step of right-padded sequences -----------------------------------------------------------------------

PAD_LEN = 60


def padded_reviews(n, s):
    """Right-padded token ids (n, 60) of length 6..60 (pad 0); the label is the verdict word the review ends with
    (ids 2..9: 2-5 negative, 6-9 positive); the rest is filler (10..99)."""
    g = gen(s)
    lengths = torch.randint(6, PAD_LEN + 1, (n,), generator=g)
    ids = torch.randint(10, 100, (n, PAD_LEN), generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    verdict = 2 + 4 * y + torch.randint(0, 4, (n,), generator=g)
    for i in range(n):
        ids[i, lengths[i] - 1] = verdict[i]
        ids[i, lengths[i]:] = 0
    return ids, lengths, y


class ReviewRNN(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.embed = nn.Embedding(100, 16, padding_idx=0)
        self.rnn = nn.RNN(16, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, ids, lengths):
        out, _ = self.rnn(self.embed(ids))
        if self.fixed:
            last = out[torch.arange(out.size(0), device=out.device), (lengths - 1).to(out.device)]
        else:
            last = out[:, -1, :]
        return self.head(last)


def review_loss(model, batch):
    ids, lengths, y = batch
    return F.cross_entropy(model(ids, lengths), y)


@case("last_step_of_right_padded_batch", "shapes",
      bug="The RNN review classifier reads out[:, -1, :] of right-padded batches: for every review shorter than the "
          "batch's 60 steps that is the state after a run of pad tokens, not after its last real word (which holds "
          "the verdict); the state at lengths - 1 (or pack_padded_sequence / h_n) is never used.",
      cause_pattern=r"pad(ded|ding)?\W.{0,100}(last|final) (time ?)?step|(last|final) (time ?)?step.{0,100}pad|"
                    r"lengths? ?- ?1|pack_padded_sequence|h_n|(last|final) (real|actual|valid|non-pad)\w* (token|step)")
def last_step_of_right_padded_batch(fixed=False):
    seed(0)
    ids, lengths, y = padded_reviews(1600, 5)
    model = ReviewRNN(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(ids[:1200], lengths[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(ids[1200:], lengths[1200:], y[1200:]), 128, shuffle=False),
                loss_fn=review_loss, max_steps=1500)


fix("last_step_of_right_padded_batch", fixed_of(last_step_of_right_padded_batch),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val accuracy", steps=300)
