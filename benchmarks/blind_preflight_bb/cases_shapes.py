"""Set bb, family shapes: axes and readouts of spectrograms and session tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_bb.registry import acc_of, case, fix, fixed_of, seed
from benchmarks.blind_preflight_bb.synth import log_spec, markov_sessions, tensors, tone_clips

# ---------------------------------------------------------------- 1. (T, F) frames fed to a Conv1d over (F, T)


class FrameConv(nn.Module):
    """Conv1d over time with the mel bands as channels, global average pooling, linear head."""

    def __init__(self, n_cls, transpose_in_forward):
        super().__init__()
        self.transpose_in_forward = transpose_in_forward
        self.conv = nn.Sequential(nn.Conv1d(32, 64, 3), nn.ReLU(), nn.Conv1d(64, 64, 3), nn.ReLU())
        self.head = nn.Linear(64, n_cls)

    def forward(self, x):  # x: (B, frames, bands), as librosa's melspectrogram(...).T gives it
        if self.transpose_in_forward:
            x = x.transpose(1, 2)
        return self.head(self.conv(x).mean(-1))


@case("kws_frames_as_conv_channels", "shapes",
      "Log-mel clips are stored frames-first (B, 32 frames, 32 bands) and fed straight into Conv1d(in_channels=32), "
      "so the frames act as channels and the convolution plus average pooling run over the frequency axis, throwing "
      "away which band the tone is in.",
      r"transpos|permut|channels?.{0,40}(frame|time)|(frame|time).{0,40}channel|(frequency|mel|band).{0,40}"
      r"(axis|dim).{0,60}(time|frame)|(time|frame).{0,40}(axis|dim).{0,60}(frequency|mel|band)|\(B, ?(T|frames),"
      r" ?(F|bands|n_mels)\)|swap.{0,20}(ax|dim)|conv1d.{0,80}(expects|wants).{0,40}\(N, ?C, ?L\)")
def kws_frames_as_conv_channels(fixed=False):
    seed(0)
    wav, y = tone_clips(1400, 8, 1)
    x = log_spec(wav).transpose(1, 2).contiguous()  # (B, frames, bands)
    x = (x - x.mean()) / x.std()
    model = FrameConv(8, transpose_in_forward=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3),
                train_loader=tensors(x[:1000], y[:1000]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(x[1000:], y[1000:], shuffle=False), max_steps=300)


fix("kws_frames_as_conv_channels", fixed_of(kws_frames_as_conv_channels),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")

# ---------------------------------------------------------------- 2. clip logits pooled over the class axis


class FrameTagger(nn.Module):
    def __init__(self, n_cls):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, n_cls))

    def forward(self, x):  # (B, bands, frames) -> frame logits (B, frames, classes)
        return self.net(x.transpose(1, 2))


def sed_data(n, s, n_cls=16, frames=16):
    """Multi-label clips: each holds 1-3 tones (band 2*k) in random frame segments; clip labels (n, n_cls)."""
    g = torch.Generator().manual_seed(s)
    x = -4 + 0.5 * torch.randn(n, 32, frames, generator=g)
    y = torch.zeros(n, n_cls)
    for i in range(n):
        for k in torch.randperm(n_cls, generator=g)[: int(torch.randint(1, 4, (1,), generator=g))]:
            a = int(torch.randint(0, frames - 4, (1,), generator=g))
            x[i, 2 * k, a:a + 4] += 5
            y[i, k] = 1
    return x, y


class ClipLoss(nn.Module):
    """Clip-level BCE from frame logits: max over the time axis (dim=1 of (B, T, C))."""

    def __init__(self, pool_dim):
        super().__init__()
        self.pool_dim, self.bce = pool_dim, nn.BCEWithLogitsLoss()

    def forward(self, frame_logits, clip_labels):
        return self.bce(frame_logits.amax(dim=self.pool_dim), clip_labels)


def clip_f1(model, kw):
    tp = fp = fn = 0.0
    model.eval()
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            p = (model(x).amax(dim=1) > 0).float()
            tp += (p * y).sum().item()
            fp += (p * (1 - y)).sum().item()
            fn += ((1 - p) * y).sum().item()
    model.train()
    return 2 * tp / max(2 * tp + fp + fn, 1.0)


@case("sed_clip_pool_over_class_axis", "shapes",
      "Frame logits are (B, T, C) with T == C == 16, and the clip logits are taken with amax(dim=-1), pooling over the "
      "classes instead of over time (dim=1): the (B, 16) result matches the (B, 16) clip labels, but each column is a "
      "frame, not a class.",
      r"(pool|max|mean|amax|reduc|aggregat).{0,60}(class|label).{0,20}(axis|dim)|(class|label).{0,20}(axis|dim)"
      r".{0,60}(instead of|rather than|not).{0,20}(time|frame)|(pool|max|amax|reduc|aggregat).{0,60}(over|along)"
      r".{0,10}(the )?(time|frame)|dim ?= ?-1.{0,60}dim ?= ?1|\(B, ?T, ?C\)|frames? (axis|dim).{0,80}class")
def sed_clip_pool_over_class_axis(fixed=False):
    seed(0)
    x, y = sed_data(1600, 2)
    model = FrameTagger(16)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=tensors(x[:1200], y[:1200]), loss_fn=ClipLoss(1 if fixed else -1),
                val_loader=tensors(x[1200:], y[1200:], shuffle=False), max_steps=300)


fix("sed_clip_pool_over_class_axis", fixed_of(sed_clip_pool_over_class_axis), clip_f1, "val clip micro-F1")

# ---------------------------------------------------------------- 3. last-position readout on right-padded sessions


class NextItNet(nn.Module):
    """Dilated causal Conv1d over the session (receptive field 7), read out at the last position."""

    def __init__(self, n_items, readout_last_real, d=48):
        super().__init__()
        self.readout_last_real = readout_last_real
        self.emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.convs = nn.ModuleList([nn.Conv1d(d, d, 3, dilation=r) for r in (1, 2)])
        self.out = nn.Linear(d, n_items + 1)

    def forward(self, seq):  # seq: (B, T) right-padded with 0
        h = self.emb(seq).transpose(1, 2)
        for conv in self.convs:
            h = h + torch.relu(conv(F.pad(h, (2 * conv.dilation[0], 0))))
        h = h.transpose(1, 2)
        if self.readout_last_real:
            last = (seq != 0).sum(1) - 1
            return self.out(h[torch.arange(seq.shape[0], device=seq.device), last])
        return self.out(h[:, -1])


def right_padded(n, n_items, s, lo=3, hi=20, order=1):
    full = markov_sessions(n, n_items, hi + 1, s, order=order)
    lengths = torch.randint(lo, hi + 1, (n,), generator=torch.Generator().manual_seed(s + 7))
    seq = torch.zeros(n, hi, dtype=torch.long)
    target = full[torch.arange(n), lengths]
    for i in range(n):
        seq[i, : lengths[i]] = full[i, : lengths[i]]
    return seq, target


@case("nextitnet_readout_at_padding", "shapes",
      "Sessions are right-padded with 0 to length 20, and the causal-CNN readout takes h[:, -1], which for every session "
      "shorter than 14 only sees padding in its receptive field, not the state at the last real item "
      "(index lengths - 1).",
      r"(last|final).{0,40}(position|step|index|time ?step|token|element|state).{0,80}(pad|padding)|"
      r"(pad|padding).{0,80}(last|final).{0,30}(position|step|index|state|output)|lengths? ?- ?1|\[:, ?-1\]|"
      r"right[- ]pad|left[- ]pad|pack_padded_sequence|gather.{0,40}length|h_n|real (last )?(item|length)")
def nextitnet_readout_at_padding(fixed=False):
    seed(0)
    seq, target = right_padded(3000, 40, 3)
    model = NextItNet(40, readout_last_real=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=tensors(seq[:2400], target[:2400]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(seq[2400:], target[2400:], shuffle=False), max_steps=300)


fix("nextitnet_readout_at_padding", fixed_of(nextitnet_readout_at_padding),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val next-item accuracy")

# ---------------------------------------------------------------- 4. bidirectional h_n reshaped with view


class BiGRUKWS(nn.Module):
    def __init__(self, n_cls, cat_directions, d=32):
        super().__init__()
        self.cat_directions = cat_directions
        self.gru = nn.GRU(32, d, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * d, n_cls)

    def forward(self, x):  # (B, bands, frames)
        _, h_n = self.gru(x.transpose(1, 2))              # h_n: (2, B, d), directions first
        if self.cat_directions:
            return self.head(torch.cat([h_n[0], h_n[1]], dim=1))
        return self.head(h_n.view(x.shape[0], -1))          # (B, 2d), but rows mix different clips


@case("bigru_h_n_view_mixes_clips", "shapes",
      "The bidirectional GRU's final state h_n is (2, B, d) with the direction first, and it is turned into (B, 2d) "
      "with h_n.view(B, -1): row i holds the states of clips 2i and 2i+1 (one direction), so each clip's label is "
      "paired with other clips' features.",
      r"h_n.{0,80}(view|reshape|direction|permute|transpose|\(2, ?B|num_layers)|view\(.{0,20}-1\).{0,80}"
      r"(mix|scrambl|interleav|wrong|other|different) (clips|samples|rows|examples|batch)|(direction|layer)s?"
      r"[- ](first|major|dim)|torch\.cat\(\[h_n\[|h_n\[-2\]|(mix|scrambl|interleav)\w*.{0,60}(batch|clips|"
      r"samples|examples)|permute\(1, ?0")
def bigru_h_n_view_mixes_clips(fixed=False):
    seed(0)
    wav, y = tone_clips(1500, 8, 4)
    x = log_spec(wav)
    x = (x - x.mean()) / x.std()
    model = BiGRUKWS(8, cat_directions=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=tensors(x[:1200], y[:1200]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(x[1200:], y[1200:], shuffle=False), max_steps=300)


fix("bigru_h_n_view_mixes_clips", fixed_of(bigru_h_n_view_mixes_clips),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")

# ---------------------------------------------------------------- 5. TransformerEncoder without batch_first


class SessionEncoder(nn.Module):
    def __init__(self, n_items, batch_first, d=64, length=8):
        super().__init__()
        self.emb = nn.Embedding(n_items + 1, d)
        self.pos = nn.Parameter(torch.randn(length, d) * 0.1)
        layer = nn.TransformerEncoderLayer(d, 4, 128, dropout=0.0, batch_first=batch_first)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(d, n_items + 1)

    def forward(self, seq):  # (B, T)
        h = self.enc(self.emb(seq) + self.pos)
        return self.out(h[:, -1])


@case("sasrec_encoder_not_batch_first", "shapes",
      "The (B, T, d) session embeddings go into nn.TransformerEncoderLayer built without batch_first=True, which reads "
      "them as (T, B, d): attention mixes different sessions at the same position and never looks across a session's "
      "items, so the second-order next-item rule cannot be learned.",
      r"batch_first|\(T, ?B|\(S, ?N|\(seq(_len)?, ?batch|seq(uence)?[- ]first|batch (dim|axis).{0,60}"
      r"(sequence|time|attention)|attend.{0,40}across.{0,20}(batch|sessions|samples)|(across|between) "
      r"(the )?(batch|samples|sessions)")
def sasrec_encoder_not_batch_first(fixed=False):
    seed(0)
    full = markov_sessions(3000, 30, 9, 6, order=2)
    seq, target = full[:, :8], full[:, 8]
    model = SessionEncoder(30, batch_first=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 1e-3),
                train_loader=tensors(seq[:2400], target[:2400]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(seq[2400:], target[2400:], shuffle=False), max_steps=300)


fix("sasrec_encoder_not_batch_first", fixed_of(sasrec_encoder_not_batch_first),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val next-item accuracy")

