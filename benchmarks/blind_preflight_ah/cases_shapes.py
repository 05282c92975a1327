"""Shapes: the tensors line up by size but not by meaning (views, reshapes, layouts, the wrong axis)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ah.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# --------------------------------------------------------------------------------------------------------------
# Semantic segmentation: the per-pixel loss flattens NCHW logits with .view(-1, C) without moving C last.


def seg_levels(n: int, s: int, size: int = 16):
    """Grey tiles whose pixels belong to 3 intensity classes laid out in smooth blobs, plus noise."""
    g = gen(s)
    field = F.avg_pool2d(torch.randn(n, 1, size + 6, size + 6, generator=g), 7, stride=1)  # smooth random field
    field = (field - field.mean()) / field.std()
    mask = torch.bucketize(field[:, 0], torch.tensor([-0.45, 0.45]))  # 0 / 1 / 2, about a third each
    image = mask.unsqueeze(1).float() + 0.55 * torch.randn(n, 1, size, size, generator=g)
    return image, mask


class TinyFCN(nn.Module):
    def __init__(self, classes: int = 3, width: int = 12):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.classifier = nn.Conv2d(width, classes, 1)

    def forward(self, x):
        return self.classifier(self.body(x))


def seg_flatten(fixed: bool = False):
    seed(0)
    x, m = seg_levels(480, 1)
    xv, mv = seg_levels(160, 2)
    model = TinyFCN()
    classes = 3

    def pixel_loss(model, batch):
        images, masks = batch
        logits = model(images)                                      # (N, C, H, W)
        if fixed:
            flat = logits.permute(0, 2, 3, 1).reshape(-1, classes)  # one row per pixel
        else:
            flat = logits.view(-1, classes)                         # "flatten to (pixels, classes)"
        return F.cross_entropy(flat, masks.view(-1))

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, m), 16),
                val_loader=loader(TensorDataset(xv, mv), 32, shuffle=False),
                loss_fn=pixel_loss, max_steps=2000)


case("ah_seg_logits_view_without_permute", "shapes",
     "The per-pixel loss flattens the (N, C, H, W) segmentation logits with logits.view(-1, C) without first moving "
     "the class axis last (permute(0, 2, 3, 1)), so each row mixes C neighbouring values of one channel and is "
     "scored against the label of an unrelated pixel of masks.view(-1).",
     r"permute\(0, ?2, ?3, ?1\)|movedim|(class|channel) (axis|dim\w*)\b.{0,60}(last|move|moved|first)|"
     r"view\(-1, ?(c|classes|num_classes|n_classes|\d+)\).{0,80}(nchw|channel|class (axis|dim)|pixel)|"
     r"(nchw|\(n, ?c, ?h, ?w\)).{0,80}(flatten|view|reshape)|(flatten|view|reshape).{0,80}(nchw|\(n, ?c, ?h, ?w\))|"
     r"(\d+, ?\d+, ?\d+, ?\d+\)).{0,60}view\(-1|(rows?|pixels?).{0,60}(scrambl|misalign|do not (line up|correspond|"
     r"match))|"
     r"(reshap\w*|flatten\w*|view\w*).{0,80}(class|channel) (axis|dim\w*)|(class|channel) (axis|dim\w*).{0,80}"
     r"(reshap|flatten|view)|rows? mix\w* (channels|classes|pixels)")(seg_flatten)

# --------------------------------------------------------------------------------------------------------------
# Sensor activity classification: a 2-layer bidirectional GRU whose final states h_n are .view(B, -1)-ed.


def activity_windows(n: int, s: int, steps: int = 12, feats: int = 4):
    """4-channel IMU-like windows; the class is which channel carries a slow oscillation and its phase sign."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    t = torch.arange(steps).float()
    x = 0.6 * torch.randn(n, steps, feats, generator=g)
    phase = torch.rand(n, 1, generator=g) * 6.28
    wave = torch.sin(0.9 * t + phase)
    channel = y % feats
    x[torch.arange(n), :, channel] += 1.2 * wave
    return x, y


class GRUClassifier(nn.Module):
    def __init__(self, feats=4, hidden=16, classes=4, fixed=False):
        super().__init__()
        self.gru = nn.GRU(feats, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(4 * hidden, classes)
        self.fixed = fixed

    def forward(self, x):
        _, h_n = self.gru(x)                                   # (layers * directions, B, hidden)
        if self.fixed:
            h = h_n.permute(1, 0, 2).reshape(x.size(0), -1)    # (B, layers * directions * hidden)
        else:
            h = h_n.view(x.size(0), -1)                        # "flatten the final states per sample"
        return self.head(h)


def gru_hidden_view(fixed: bool = False):
    seed(0)
    x, y = activity_windows(768, 3)
    xv, yv = activity_windows(256, 4)
    model = GRUClassifier(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(xv, yv), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


case("ah_gru_final_state_view_mixes_samples", "shapes",
     "A 2-layer bidirectional GRU's final states h_n of shape (layers * directions, B, hidden) are flattened with "
     "h_n.view(B, -1) instead of h_n.permute(1, 0, 2).reshape(B, -1), so row b of the classifier input holds one "
     "layer-direction's states of samples 4b to 4b+3 instead of the four final states of sample b, and every sample "
     "is classified from other samples' sequences.",
     r"h_n|hidden state|final state|(layers?|num_layers)\s*\*\s*(num_)?directions|"
     r"(batch|sample)s?.{0,60}(mix|mixed|mixing|interleav|leak|swap|other sample)|"
     r"permute\(1, ?0, ?2\)|transpose\(0, ?1\)|batch (axis|dim\w*) (is )?(second|1|not first)")(gru_hidden_view)

# --------------------------------------------------------------------------------------------------------------
# Review classification: an LSTM over right-padded reviews, classified from output[:, -1] (a padding step).

PAD = 0


def reviews(n: int, s: int, max_len: int = 40, vocab: int = 60):
    """Short reviews (4..12 tokens) right-padded to 40; sentiment = more 'good' (ids 3..12) than 'bad' (13..22)
    tokens."""
    g = gen(s)
    lengths = torch.randint(4, 13, (n,), generator=g)
    tokens = torch.randint(3, vocab, (n, max_len), generator=g)
    pos = torch.arange(max_len)
    tokens[pos.unsqueeze(0) >= lengths.unsqueeze(1)] = PAD
    real = tokens != PAD
    good = ((tokens >= 3) & (tokens < 13) & real).sum(1)
    bad = ((tokens >= 13) & (tokens < 23) & real).sum(1)
    y = (good > bad).long()
    tie = good == bad
    y[tie] = (tokens[tie, 0] % 2)  # ties: decided by the first word
    return tokens, lengths, y


class ReviewLSTM(nn.Module):
    def __init__(self, vocab=60, dim=24, hidden=32, fixed=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=PAD)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 2)
        self.fixed = fixed

    def forward(self, tokens):
        states, _ = self.lstm(self.embed(tokens))             # (B, T, hidden), right-padded
        if self.fixed:
            last = (tokens != PAD).sum(1) - 1                  # index of each review's last real token
            summary = states[torch.arange(tokens.size(0), device=tokens.device), last]
        else:
            summary = states[:, -1]                            # "the last time step"
        return self.out(summary)


def lstm_last_step_padding(fixed: bool = False):
    seed(0)
    tok, _, y = reviews(1024, 5)
    tokv, _, yv = reviews(384, 6)
    model = ReviewLSTM(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(tok, y), 32),
                val_loader=loader(TensorDataset(tokv, yv), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


case("ah_lstm_last_step_is_padding", "shapes",
     "The review classifier reads the LSTM output at the last time step, output[:, -1], of right-padded batches "
     "(reviews of 4-12 tokens padded to 40), so for every review it classifies the state after 28-36 padding "
     "tokens instead of the state at its last real token (gather at lengths - 1, or pack_padded_sequence).",
     r"pad(ding|ded)?\b.{0,80}(last|final) (time ?step|step|position|output|state)|"
     r"(last|final) (time ?step|step|position|output|state).{0,80}pad|"
     r"pack_padded_sequence|lengths? ?- ?1|output\[:, ?-1\]|\[:, ?-1(, ?:)?\]")(lstm_last_step_padding)

# --------------------------------------------------------------------------------------------------------------
# Explicit-feedback matrix factorisation: scores = U @ V.T gives a (B, B) table, broadcast against (B,) ratings.


def ratings(n: int, s: int, users: int = 100, items: int = 80, dim: int = 4):
    """Star ratings driven only by user x item taste (no item or user bias): r = 3 + 1.4 * <p_u, q_i> + noise."""
    g = gen(100)  # the same taste for every split
    p = torch.randn(users, dim, generator=g) / dim ** 0.5
    q = torch.randn(items, dim, generator=g)
    g = gen(s)
    u = torch.randint(0, users, (n,), generator=g)
    i = torch.randint(0, items, (n,), generator=g)
    r = (3 + 1.4 * (p[u] * q[i]).sum(1) + 0.2 * torch.randn(n, generator=g)).clamp(1, 5)
    return u, i, r


class MF(nn.Module):
    def __init__(self, users=100, items=80, dim=8, fixed=False):
        super().__init__()
        self.user = nn.Embedding(users, dim)
        self.item = nn.Embedding(items, dim)
        self.bias = nn.Parameter(torch.tensor(3.0))
        self.fixed = fixed
        nn.init.normal_(self.user.weight, std=0.3)
        nn.init.normal_(self.item.weight, std=0.3)

    def forward(self, users, items):
        pu, qi = self.user(users), self.item(items)
        if self.fixed:
            return (pu * qi).sum(-1) + self.bias      # one score per (user, item) pair
        return pu @ qi.T + self.bias                  # "dot product of user and item vectors"


def mf_outer_product(fixed: bool = False):
    seed(0)
    u, i, r = ratings(6000, 11)
    uv, iv, rv = ratings(2000, 12)
    model = MF(fixed=fixed)

    def rating_loss(model, batch):
        users, items, stars = batch
        return F.mse_loss(model(users, items), stars)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=loader(TensorDataset(u, i, r), 128),
                val_loader=loader(TensorDataset(uv, iv, rv), 500, shuffle=False),
                loss_fn=rating_loss, max_steps=3000)


case("ah_mf_scores_outer_product", "shapes",
     "The matrix-factorisation model scores a batch with user_vecs @ item_vecs.T, a (B, B) table of every user "
     "against every item of the batch, and F.mse_loss broadcasts the (B,) ratings across its rows, so each user is "
     "fitted to the ratings other users gave; the pairwise score is (user_vecs * item_vecs).sum(-1).",
     r"(predictions?|outputs?|scores?) (of )?(shape )?\((?P<b1>\d+|b|batch(_size)?), ?(?P=b1)\)|"
     r"\((?P<b2>\d+|b), ?(?P=b2)\) (outputs?|predictions?|scores?)|outer product|all pairs|every (user|pair)|pairwise|"
     r"(matmul|@|torch\.mm|\.t\(\)|\.T\b).{0,80}(instead|rather|elementwise|\* ?\w+\)?\.sum|sum\(-?1\)|diag)|"
     r"(elementwise|element-wise).{0,40}(product|multipl)|\(\w+ \* \w+\)\.sum")(mf_outer_product)

# --------------------------------------------------------------------------------------------------------------
# Multivariate sensor windows (B, T, F) fed to nn.Conv1d(in_channels=T): the kernel slides over the features.


def motif_windows(n: int, s: int, steps: int = 32, feats: int = 6):
    """Machine-vibration windows: class = which of 3 short motifs (rise, fall, spike) appears at a random time."""
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    x = 0.5 * torch.randn(n, steps, feats, generator=g)
    motifs = torch.tensor([[0.0, 0.6, 1.2, 1.8, 2.4], [2.4, 1.8, 1.2, 0.6, 0.0], [0.0, 0.0, 3.0, 0.0, 0.0]])
    start = torch.randint(0, steps - 5, (n,), generator=g)
    chan = torch.randint(0, feats, (n,), generator=g)
    for i in range(n):
        x[i, start[i]:start[i] + 5, chan[i]] += motifs[y[i]] - motifs[y[i]].mean()
    return x, y


class VibrationCNN(nn.Module):
    def __init__(self, steps=32, feats=6, width=24, fixed=False):
        super().__init__()
        self.fixed = fixed
        in_ch = feats if fixed else steps       # "Conv1d(input_shape=(steps, feats))" as in Keras
        self.conv = nn.Sequential(nn.Conv1d(in_ch, width, 5, padding=2), nn.ReLU(),
                                  nn.Conv1d(width, width, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(width, 3)

    def forward(self, x):                       # x: (B, steps, feats)
        if self.fixed:
            x = x.transpose(1, 2)               # (B, feats, steps): convolve along time
        return self.fc(self.conv(x).amax(-1))


def conv1d_over_features(fixed: bool = False):
    seed(0)
    x, y = motif_windows(768, 9)
    xv, yv = motif_windows(384, 10)
    model = VibrationCNN(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


case("ah_conv1d_slides_over_features", "shapes",
     "Sensor windows shaped (batch, time, features) go straight into nn.Conv1d(in_channels=time_steps, ...), so the "
     "32 time steps are treated as channels and the kernel slides over the 6 sensor features instead of over time "
     "(the input needs x.transpose(1, 2) to (batch, features, time) and in_channels=features).",
     r"conv1d.{0,80}(channel|time|length|transpose|permute|layout)|"
     r"(time|sequence)[- ]?(steps?|axis|length|dim\w*).{0,60}(as|treated as|used as|in place of) (the )?channels?|"
     r"in_channels.{0,60}(time|seq|window|length|steps)|\(batch, ?(time|seq\w*|length|steps), ?(features|channels)\)|"
     r"\(n, ?l, ?c\)|transpose\(1, ?2\)|(slides?|sliding|convolv\w*) (over|along|across) (the )?(features|sensors|"
     r"channels)")(conv1d_over_features)


# --------------------------------------------------------------------------------------------------------------
# The one-line fixes verify.py trains next to each case, and the metric both are scored on.

fix("ah_seg_logits_view_without_permute", fixed_of(seg_flatten),
    acc_of(lambda m, b: (m(b[0]).argmax(1), b[1])), "val pixel accuracy")
fix("ah_gru_final_state_view_mixes_samples", fixed_of(gru_hidden_view),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=150)
fix("ah_lstm_last_step_is_padding", fixed_of(lstm_last_step_padding),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


def _pair_scores(m, b):
    out = m(b[0], b[1])
    return (out.diagonal() if out.dim() == 2 else out), b[2]


fix("ah_mf_scores_outer_product", fixed_of(mf_outer_product), rmse_of(_pair_scores),
    "val RMSE (stars) of each (user, item) pair's own score", steps=200, higher=False)
fix("ah_conv1d_slides_over_features", fixed_of(conv1d_over_features),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")
