"""Family ``shapes``: shapes and broadcasting at the loss, wrong dims in normalisation/reshapes, batch/time axes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_k.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_of,
    seed,
    split,
    teacher_classes,
    teacher_regression,
)


# --- 1. house prices: (N, 1) predictions against (N,) targets in MSELoss --------------------------------------------
def price_mlp_target_broadcast(fixed: bool = False):
    seed(0)
    x, y = teacher_regression(1200, 8, s=11)
    if fixed:
        y = y.unsqueeze(1)                     # targets shaped like the predictions: (N, 1)
    (xt, yt), (xv, yv) = split(x, y, 960)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(xt, yt), batch_size=48),
                val_loader=loader(TensorDataset(xv, yv), batch_size=48, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=400)


case("price_mlp_target_broadcast", "shapes",
     "The regressor outputs (48, 1) while the price targets are (48,): nn.MSELoss broadcasts them to a (48, 48) "
     "matrix of every prediction against every target, so the net learns only the mean price; unsqueeze the targets "
     "to (N, 1) or squeeze the output.",
     r"[(\[]\s*48\s*,\s*1\s*[)\]]|[(\[]\s*48\s*,\s*48\s*[)\]]|MSE\w*.{0,120}broadcast|broadcast.{0,120}MSE|"
     r"every prediction against every target|all pairs of (predictions|samples)|pairwise",
     )(price_mlp_target_broadcast)
fix("price_mlp_target_broadcast", fixed_of(price_mlp_target_broadcast),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", steps=300, higher=False)


# --- 2. sensor windows fed batch-first to an LSTM built seq-first ------------------------------------------------------
class SensorLSTM(nn.Module):
    def __init__(self, batch_first: bool):
        super().__init__()
        self.lstm = nn.LSTM(3, 32, batch_first=batch_first)
        self.head = nn.Linear(32, 2)

    def forward(self, x):                      # x: (batch, time, channels), as the loader yields it
        out, _ = self.lstm(x)
        return self.head(out[:, -1])           # "the last time step", Keras style


def sensor_lstm_missing_batch_first(fixed: bool = False):
    seed(0)
    g = gen(21)
    x = torch.randn(1280, 20, 3, generator=g)
    y = (x[:, :, 0].sum(1) > 0).long()        # the drift of channel 0 over the whole window
    (xt, yt), (xv, yv) = split(x, y, 1024)
    model = SensorLSTM(batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(xt, yt), batch_size=64),
                val_loader=loader(TensorDataset(xv, yv), batch_size=64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("sensor_lstm_missing_batch_first", "shapes",
     "nn.LSTM is built without batch_first=True but fed (batch, time, channels) windows: it runs its recurrence "
     "across the samples of the batch instead of over time, and out[:, -1] picks the last sample's step, so each "
     "prediction sees one time step of several windows; pass batch_first=True.",
     r"batch_first|batch[- ]first|\(seq(uence)?[_ ]?len(gth)?, ?batch|\(time, ?batch|"
     r"(batch|time) (and|/) (time|batch) (axes|dims|dimensions) (are )?(swapped|confused|transposed)|"
     r"recurren\w+ (runs )?(across|over) the (samples|batch)",
     )(sensor_lstm_missing_batch_first)
fix("sensor_lstm_missing_batch_first", fixed_of(sensor_lstm_missing_batch_first),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)


# --- 3. NHWC tiles reshaped (not permuted) to NCHW --------------------------------------------------------------------
def _tiles(n, s):
    """Channels-last tiles (N, 16, 16, 3) as a numpy/PIL pipeline gives them: the class is the band a blob is bright in."""
    g = gen(s)
    img = 0.3 * torch.randn(n, 16, 16, 3, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    r = torch.randint(0, 12, (n, 2), generator=g)
    for i in range(n):
        img[i, r[i, 0]:r[i, 0] + 4, r[i, 1]:r[i, 1] + 4, y[i]] += 1.5
    return img, y


def satellite_cnn_nhwc_reshape(fixed: bool = False):
    seed(0)
    img, y = _tiles(1500, 31)
    n = img.shape[0]
    x = img.permute(0, 3, 1, 2).contiguous() if fixed else img.reshape(n, 3, 16, 16)
    (xt, yt), (xv, yv) = split(x, y, 1200)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), batch_size=50),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("satellite_cnn_nhwc_reshape", "shapes",
     "The channels-last (N, H, W, 3) tiles are turned into NCHW with reshape(N, 3, H, W) instead of "
     "permute(0, 3, 1, 2): reshape reinterprets memory, so the three 'channels' are interleaved slices of rows and "
     "every band is scrambled across pixels; use permute.",
     r"permute|channels[- ]last|NHWC|\(N, ?H, ?W, ?C\)|reshape.{0,60}(instead of|rather than|not).{0,30}(permute|"
     r"transpose)|(interleav|scrambl)\w+ (the )?(channels|bands|pixels)",
     )(satellite_cnn_nhwc_reshape)
fix("satellite_cnn_nhwc_reshape", fixed_of(satellite_cnn_nhwc_reshape),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)


# --- 4. LogSoftmax over the batch dimension ---------------------------------------------------------------------------
def loan_mlp_logsoftmax_dim0(fixed: bool = False):
    seed(0)
    x, y = teacher_classes(1600, 16, 10, s=41)
    (xt, yt), (xv, yv) = split(x, y, 1280)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 10), nn.LogSoftmax(dim=1 if fixed else 0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), batch_size=64),
                val_loader=loader(TensorDataset(xv, yv), batch_size=64, shuffle=False),
                loss_fn=nn.NLLLoss(), max_steps=300)


case("loan_mlp_logsoftmax_dim0", "shapes",
     "The classifier ends in nn.LogSoftmax(dim=0), which normalises each class column over the samples of the batch "
     "instead of each row over the classes, so NLLLoss ranks samples against each other rather than classes; use "
     "dim=1 (or dim=-1).",
     r"(log_?)?softmax.{0,60}dim\s*=?\s*0|dim\s*=\s*0.{0,60}softmax|(over|across|along) the batch (dim|axis|"
     r"dimension)|normali[sz]\w+ (over|across) (the )?(samples|batch)|sum to (one|1) over (the )?(batch|samples)|"
     r"(rows|probabilities) do not sum to (one|1)|(along|over|across) (dim(ension)?|axis) 0",
     )(loan_mlp_logsoftmax_dim0)
fix("loan_mlp_logsoftmax_dim0", fixed_of(loan_mlp_logsoftmax_dim0),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=250)


# --- 5. seq-first transformer output flattened against batch-first tags ------------------------------------------------
class SeqFirstTagger(nn.Module):
    def __init__(self, vocab=40, tags=5, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0)           # seq-first by default
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, tags)

    def forward(self, tokens):                 # tokens (B, T) -> logits (T, B, tags)
        h = self.emb(tokens).transpose(0, 1)
        return self.head(self.encoder(h))


def _tagging(n, s, t=12):
    g = gen(s)
    tok = torch.randint(0, 40, (n, t), generator=g)
    return tok, (tok * 7 + 3) % 5              # each word's tag is fixed by the word


def pos_tagger_seqfirst_flatten(fixed: bool = False):
    seed(0)
    tok, tags = _tagging(1000, 51)
    (xt, yt), (xv, yv) = split(tok, tags, 800)
    model = SeqFirstTagger()

    def loss_fn(model, batch):
        tokens, target = batch
        logits = model(tokens)                 # (T, B, C)
        if fixed:
            logits = logits.transpose(0, 1)    # back to (B, T, C) like the targets
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt, yt), batch_size=32),
                val_loader=loader(TensorDataset(xv, yv), batch_size=32, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


case("pos_tagger_seqfirst_flatten", "shapes",
     "The tagger's nn.TransformerEncoder returns seq-first (T, B, C) logits, but the loss flattens them with "
     "reshape(-1, C) against the batch-first (B, T) tags, so logit row i is scored against the tag of another token "
     "of another sentence; transpose(0, 1) the logits before flattening.",
     r"transpose\(0, ?1\)|seq(uence)?[- ]first|\(T, ?B|\(seq(_?len)?, ?batch|"
     r"misalign\w*.{0,80}(flatten|reshape|view)|(flatten|reshape|view)\w*.{0,80}(misalign|different order)|"
     r"batch[- ]first (targets|tags|labels)",
     )(pos_tagger_seqfirst_flatten)
fix("pos_tagger_seqfirst_flatten", fixed_of(pos_tagger_seqfirst_flatten),
    acc_of(lambda m, b: (m(b[0]).transpose(0, 1).argmax(-1), b[1])), "val token accuracy", steps=250)
