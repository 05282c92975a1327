"""Set n, family shapes: tensors whose axes are not what the code thinks they are (no crash)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_n.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed, split

# --- 1. Keyword spotting: a transformer encoder left sequence-first, read at its [CLS] token ----------------------
# Source: https://github.com/Exorust/TorchLeet/issues/5 (TransformerEncoderLayer needs batch_first=True for
# (batch, seq, feature) inputs; with the default the training loss stays high).

def keyword_clips(n: int, s: int, frames: int = 12, mels: int = 16):
    """Two 2-frame bursts per clip in two mel bands; the word (class) is which pair of bands and which comes first."""
    g = gen(s)
    x = 0.3 * torch.randn(n, frames, mels, generator=g)
    pair = torch.randint(0, 2, (n,), generator=g)
    order = torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        t1 = int(torch.randint(0, frames // 2 - 1, (1,), generator=g))
        t2 = int(torch.randint(frames // 2, frames - 1, (1,), generator=g))
        first, second = (t1, t2) if order[i] == 0 else (t2, t1)
        low, high = (0, 8) if pair[i] == 0 else (4, 12)
        x[i, first:first + 2, low:low + 4] += 2.0
        x[i, second:second + 2, high:high + 4] += 2.0
    return x, pair * 2 + order


class KeywordTransformer(nn.Module):
    def __init__(self, mels=16, d=32, n_words=4, frames=12, batch_first=False):
        super().__init__()
        self.proj = nn.Linear(mels, d)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(0.02 * torch.randn(1, frames + 1, d))
        layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d, n_words)

    def forward(self, mel):                      # mel: (batch, frames, mels)
        h = self.proj(mel)
        h = torch.cat([self.cls.expand(h.size(0), -1, -1), h], dim=1) + self.pos
        h = self.encoder(h)
        return self.head(h[:, 0])                # the [CLS] token


@case("keyword_transformer_seq_first", "shapes",
      bug="nn.TransformerEncoderLayer is built without batch_first=True while the mel frames come as (batch, frames, "
          "mels), so the encoder reads them as (seq, batch, feature): attention runs across the batch and the [CLS] "
          "token read at h[:, 0] only ever attends to the other clips' [CLS] tokens, never to its own frames.",
      cause_pattern=r"batch_first|seq(uence)?[- ]first|\(seq(_len)?, ?batch|\(S, ?N, ?E\)|\(T, ?N, ?E\)"
                    r"|attend\w* (across|over) (the )?(batch|other (clips|samples|examples))"
                    r"|batch (dimension|axis|dim) (is )?(treated|read|used|taken) as (the )?(sequence|time)"
                    r"|(sequence|time) (dimension|axis|dim) (is )?(treated|read|used|taken) as (the )?batch"
                    r"|mix\w* (information )?(across|between) (samples|examples|clips) (in|of) (the|a) batch")
def keyword_transformer_seq_first(fixed: bool = False):
    seed(0)
    x, y = keyword_clips(1280, 1)
    (xt, yt), (xv, yv) = split(x, y, 1024)
    model = KeywordTransformer(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt, yt), 32),
                val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("keyword_transformer_seq_first", fixed_of(keyword_transformer_seq_first),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --- 2. Activity recognition: (batch, time, axes) windows turned channels-first with .view ------------------------
# Source: https://github.com/zhouhaoyi/Informer2020/issues/59 (tensor.view used to change the order of dimensions:
# view keeps the memory order, so it scrambles instead of transposing; fixed with permute).

def gesture_windows(n: int, s: int, steps: int = 48):
    """Accelerometer windows (batch, time, 3 axes): one tap burst on one axis, slow or fast; class = axis x speed."""
    g = gen(s)
    x = 0.3 * torch.randn(n, steps, 3, generator=g)
    axis = torch.randint(0, 3, (n,), generator=g)
    speed = torch.randint(0, 2, (n,), generator=g)
    t = torch.arange(12, dtype=torch.float32)
    for i in range(n):
        start = int(torch.randint(4, steps - 16, (1,), generator=g))
        freq = 0.15 if speed[i] == 0 else 0.4
        x[i, start:start + 12, axis[i]] += 2.0 * torch.sin(2 * math.pi * freq * t)
    return x, axis * 2 + speed


class GestureCNN(nn.Module):
    def __init__(self, permute=False):
        super().__init__()
        self.permute = permute
        self.net = nn.Sequential(nn.Conv1d(3, 16, 5, padding=2), nn.ReLU(), nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(),
                                 nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, 6))

    def forward(self, x):                        # x: (batch, time, axes), as the CSV rows come
        if self.permute:
            x = x.permute(0, 2, 1)
        else:
            x = x.view(x.size(0), x.size(2), x.size(1))   # "channels first" for Conv1d
        return self.net(x)


@case("gesture_conv1d_view_not_permute", "shapes",
      bug="The (batch, time, axes) accelerometer windows are made channels-first for Conv1d with "
          "x.view(batch, axes, time) instead of x.permute(0, 2, 1): view keeps the memory order, so each 'channel' is "
          "a stretch of time with the three axes interleaved and the axis a tap happened on is lost.",
      cause_pattern=r"(permute|transpose|swapaxes|movedim)\w*.{0,80}(channel|time|axis|axes|dim)"
                    r"|(channel|time|axis|axes|dimension)s?\b.{0,80}(permute|transpose|movedim)"
                    r"|interleav|\.view\(.{0,40}\).{0,80}(memory|storage) order"
                    r"|(memory|storage) order.{0,80}\.view\(|scrambl\w* (the )?(channels?|axes|time steps)")
def gesture_conv1d_view_not_permute(fixed: bool = False):
    seed(0)
    x, y = gesture_windows(1280, 2)
    (xt, yt), (xv, yv) = split(x, y, 1024)
    model = GestureCNN(permute=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 32),
                val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("gesture_conv1d_view_not_permute", fixed_of(gesture_conv1d_view_not_permute),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --- 3. Review classifier: a GRU over right-padded reviews read at its last time step ----------------------------
# Source: https://github.com/keitakurita/practical-torchtext/issues/5 (hdn[-1] is not the last timestep of the
# shorter, padded sequences).

PAD = 0


def padded_reviews(n: int, s: int, width: int = 48, vocab: int = 100):
    """Short reviews (4-10 tokens) right-padded to 48; one aspect word (ids 1-4) somewhere in it is the class."""
    g = gen(s)
    x = torch.full((n, width), PAD, dtype=torch.long)
    y = torch.randint(0, 4, (n,), generator=g)
    for i in range(n):
        length = int(torch.randint(4, 11, (1,), generator=g))
        x[i, :length] = torch.randint(10, vocab, (length,), generator=g)
        x[i, int(torch.randint(0, length, (1,), generator=g))] = 1 + y[i]
    return x, y


class ReviewGRU(nn.Module):
    def __init__(self, vocab=100, last_valid=False):
        super().__init__()
        self.last_valid = last_valid
        self.emb = nn.Embedding(vocab, 32, padding_idx=PAD)
        self.gru = nn.GRU(32, 64, batch_first=True)
        self.out = nn.Linear(64, 4)

    def forward(self, tokens):
        h, _ = self.gru(self.emb(tokens))
        if self.last_valid:
            lengths = (tokens != PAD).sum(1)
            last = h[torch.arange(tokens.size(0), device=tokens.device), lengths - 1]
        else:
            last = h[:, -1]
        return self.out(last)


def build_review_gru(fixed: bool = False):
    seed(0)
    x, y = padded_reviews(1280, 3)
    (xt, yt), (xv, yv) = split(x, y, 1024)
    model = ReviewGRU(last_valid=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 32),
                val_loader=loader(TensorDataset(xv, yv), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("review_gru_last_step_is_padding", "shapes",
      bug="The GRU runs over reviews right-padded to 48 tokens and the classifier reads h[:, -1], the output after "
          "the padding, not the last real token (lengths - 1): for a 6-token review that is 42 pad steps later.",
      cause_pattern=r"pad(ding|ded)? (tokens?|steps?|positions?).{0,80}(last|final)"
                    r"|(last|final) (time ?step|step|position|output|hidden state)s?.{0,80}pad"
                    r"|pack_padded_sequence|lengths? ?- ?1|gather\w*.{0,60}length|h\[:, ?-1\]|\[:, ?-1(, ?:)?\]")
def review_gru_last_step_is_padding(fixed: bool = False):
    return build_review_gru(fixed)


fix("review_gru_last_step_is_padding", fixed_of(review_gru_last_step_is_padding),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --- 4. Intrusion detection: LogSoftmax over dim 0 of a (batch, classes) output --------------------------------
# Source: https://github.com/DeepReinforcementLearning/DeepReinforcementLearningInAction/issues/32 (Softmax(dim=0)
# on a batch input normalises along the batch instead of over the classes).

def flows(n: int, s: int, d: int = 20, c: int = 5):
    """Network-flow features; mostly normal traffic (class 0), the attack type a noisy nonlinear function of them."""
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w1 = torch.randn(d, 32, generator=g) / d ** 0.5
    w2 = torch.randn(32, c, generator=g)
    prior = torch.tensor([4.5, 0.0, 0.0, -0.5, -1.0])
    return x, (torch.tanh(x @ w1) @ w2 + prior + 0.5 * torch.randn(n, c, generator=g)).argmax(1)


@case("intrusion_logsoftmax_over_batch", "shapes",
      bug="The classifier ends in nn.LogSoftmax(dim=0) before nn.NLLLoss, so each class column is normalised across "
          "the 64 flows of the batch instead of each flow across its 5 classes (dim=1).",
      cause_pattern=r"(log_?)?softmax\w*\(\s*(dim\s*=\s*)?0\)|softmax\w*.{0,40}dim\s*=\s*0|dim\s*=\s*0.{0,60}softmax"
                    r"|normali[sz]\w* (over|across|along) the batch"
                    r"|(over|across|along) the batch (dimension|axis|dim)\w*.{0,40}(instead of|not|rather than) "
                    r"(over |across )?(the )?class")
def intrusion_logsoftmax_over_batch(fixed: bool = False):
    seed(0)
    x, y = flows(2560, 4)
    (xt, yt), (xv, yv) = split(x, y, 2048)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5), nn.LogSoftmax(dim=1 if fixed else 0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt, yt), 64),
                val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=nn.NLLLoss(), max_steps=300)


fix("intrusion_logsoftmax_over_batch", fixed_of(intrusion_logsoftmax_over_batch),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --- 5. Movie ratings: a dot product summed over the whole batch -------------------------------------------------
# Source: https://github.com/keras-team/keras-io/issues/397 (the collaborative-filtering dot product returns a single
# value collapsing all batch dimensions instead of one per (user, movie) pair).

def ratings(n: int, s: int, users: int = 200, items: int = 150, k: int = 4):
    g = gen(s)
    pu, qi = torch.randn(users, k, generator=g), torch.randn(items, k, generator=g)
    u = torch.randint(0, users, (n,), generator=g)
    i = torch.randint(0, items, (n,), generator=g)
    r = (pu[u] * qi[i]).sum(1) / k ** 0.5 + 0.2 * torch.randn(n, generator=g)
    return torch.stack([u, i], 1), r


class DotRecommender(nn.Module):
    def __init__(self, users=200, items=150, dim=16, per_pair=False):
        super().__init__()
        self.per_pair = per_pair
        self.user = nn.Embedding(users, dim)
        self.item = nn.Embedding(items, dim)
        nn.init.normal_(self.user.weight, std=0.3)
        nn.init.normal_(self.item.weight, std=0.3)

    def forward(self, pairs):
        u, v = self.user(pairs[:, 0]), self.item(pairs[:, 1])
        return (u * v).sum(dim=1) if self.per_pair else (u * v).sum()


@case("ratings_dot_product_summed_over_batch", "shapes",
      bug="The recommender's dot product is (user_vec * item_vec).sum() with no dim=1, so it returns one scalar for "
          "the whole batch, which MSELoss then compares (broadcast) with every rating in the batch.",
      cause_pattern=r"\.sum\(\s*\)|sum\(\) (with )?no dim|sum\w* over the (whole|entire) batch"
                    r"|(one|a single) (scalar|number|value|prediction)\w* (for|per|across) (the )?(whole |entire )?batch"
                    r"|(dot|sum)\w*.{0,60}dim\s*=\s*(1|-1)|dim\s*=\s*(1|-1).{0,40}(dot|sum)"
                    r"|tensordot|collaps\w* the batch|0-d (output|prediction)|torch\.Size\(\[\]\)")
def ratings_dot_product_summed_over_batch(fixed: bool = False):
    seed(0)
    x, y = ratings(6000, 5)
    (xt, yt), (xv, yv) = split(x, y, 5000)
    model = DotRecommender(per_pair=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-2),
                train_loader=loader(TensorDataset(xt, yt), 64),
                val_loader=loader(TensorDataset(xv, yv), 500, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("ratings_dot_product_summed_over_batch", fixed_of(ratings_dot_product_summed_over_batch),
    rmse_of(lambda m, b: (m(b[0]).expand(b[1].shape), b[1])), "val RMSE", higher=False)
