"""Set ar, family targets: what the model is asked to predict is not what the user meant."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_ar.registry import (
    TAU,
    acc_on,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    own_val,
    rmse_on,
    seed,
    sine_series,
    truth_val,
)


class NextValueWindows(Dataset):
    """A user's sliding-window Dataset over one long series: inputs series[i : i + window], target the next value."""

    def __init__(self, series, window, fixed):
        self.s, self.w, self.fixed = series, window, fixed

    def __len__(self):
        return len(self.s) - self.w - 1

    def __getitem__(self, i):
        x = self.s[i:i + self.w]
        y = self.s[i + self.w] if self.fixed else self.s[i + self.w - 1]
        return x, y.reshape(1)


@case("next_value_label_is_last_input", "targets",
      bug="The sliding-window Dataset labels window series[i : i + w] with series[i + w - 1], its own last input "
          "value, instead of series[i + w], the next value, so the model learns to copy the last input.",
      cause_pattern=r"off[- ]by[- ]one|(last|final) (input|value|element|observation|sample) of (the|its) (input )?"
                    r"window|i ?\+ ?(w|window\w*|seq\w*|lookback) ?- ?1|cop(y|ies|ying) (its|the) (last|final) input|"
                    r"(target|label) (is|equals|overlaps|duplicates) (the|its|an?) (last )?input|(label|target) "
                    r"leak\w*.{0,40}window|shift\w* (the )?(targets?|labels?) by one|persistence")
def next_value_label_is_last_input(fixed: bool = False):
    seed(0)
    s = sine_series(1, 3000, s=21)[0]
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(NextValueWindows(s[:2400], 24, fixed), 64), loss_fn=nn.MSELoss(),
                val_loader=loader(NextValueWindows(s[2400:], 24, fixed), 256, shuffle=False), max_steps=300)


fix("next_value_label_is_last_input", fixed_of(next_value_label_is_last_input),
    rmse_on(truth_val(next_value_label_is_last_input), lambda m, b: (m(b[0]), b[1])), "next-value RMSE",
    higher=False)


ACTIVITIES = ["cycle", "jog", "run", "sit", "stand", "walk"]


def _subject_recordings(n_subjects, s):
    """Per subject: windows (n, T, 3) and activity NAMES; each subject performs a random subset of activities."""
    g = gen(s)
    t = torch.arange(40).float()
    subjects = []
    for _ in range(n_subjects):
        k = int(torch.randint(3, 6, (1,), generator=g))
        acts = torch.randperm(6, generator=g)[:k]
        y = acts[torch.randint(0, k, (120,), generator=g)]
        f = (0.03 + 0.03 * y.float())[:, None, None]
        x = torch.sin(TAU * f * t[None, :, None] + TAU * torch.rand(120, 1, 3, generator=g))
        x = x + 0.4 * torch.randn(120, 40, 3, generator=g)
        subjects.append((x, [ACTIVITIES[i] for i in y.tolist()]))
    return subjects


def _encode(subjects, per_subject):
    xs, ys = [], []
    for x, names in subjects:
        classes = sorted(set(names)) if per_subject else ACTIVITIES     # LabelEncoder().fit(names).classes_
        index = {c: i for i, c in enumerate(classes)}
        xs.append(x)
        ys.append(torch.tensor([index[c] for c in names]))
    return torch.cat(xs), torch.cat(ys)


@case("har_label_encoder_per_subject", "targets",
      bug="Activity names are integer-encoded subject by subject with a LabelEncoder fitted on each subject's own "
          "labels, so the same id means different activities for subjects who did different subsets of activities.",
      cause_pattern=r"label ?encoder.{0,80}(per|each|every|separately|own)|(per|each|every)[- ](subject|file|"
                    r"recording|session|participant).{0,80}(encod|mapping|label (map|id|index))|(encod|mapping|map)"
                    r"\w*.{0,60}(inconsisten|differ|not consistent|chang).{0,60}(subject|file|recording|session)|same "
                    r"(integer|id|index|label|class id).{0,40}different (activit|class)|fit\w* (the encoder|it) once")
def har_label_encoder_per_subject(fixed: bool = False):
    seed(0)
    train = _subject_recordings(12, s=22)
    val = _subject_recordings(4, s=23)
    xt, yt = _encode(train, per_subject=not fixed)
    xv, yv = _encode(val, per_subject=not fixed)

    class HarGRU(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(3, 32, batch_first=True)
            self.fc = nn.Linear(32, 6)

        def forward(self, x):
            return self.fc(self.gru(x)[1][-1])

    model = HarGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 64), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(xv, yv), 120, shuffle=False), max_steps=300)


fix("har_label_encoder_per_subject", fixed_of(har_label_encoder_per_subject),
    acc_on(truth_val(har_label_encoder_per_subject)), "val accuracy (one global encoding)")


class Seq2SeqForecaster(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.enc = nn.GRU(1, hidden, batch_first=True)
        self.dec = nn.GRU(1, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x, dec_in):             # x (B, w), dec_in (B, H): teacher forcing
        _, h = self.enc(x.unsqueeze(-1))
        o, _ = self.dec(dec_in.unsqueeze(-1), h)
        return self.out(o).squeeze(-1)

    @torch.no_grad()
    def forecast(self, x, horizon):           # autoregressive, as at inference
        _, h = self.enc(x.unsqueeze(-1))
        inp, preds = x[:, -1:], []
        for _ in range(horizon):
            o, h = self.dec(inp.unsqueeze(-1), h)
            inp = self.out(o).squeeze(-1)
            preds.append(inp)
        return torch.cat(preds, 1)


def _seq2seq_batches(series, w, H, fixed):
    u = series.unfold(1, w + H, 3).reshape(-1, w + H)
    x, y = u[:, :w].contiguous(), u[:, w:].contiguous()
    dec_in = torch.cat([x[:, -1:], y[:, :-1]], 1) if fixed else y.clone()
    return TensorDataset(x, dec_in, y)


def teacher_forced_mse(model, batch):
    x, dec_in, y = batch
    return F.mse_loss(model(x, dec_in), y)


@case("seq2seq_teacher_forcing_unshifted", "targets",
      bug="Teacher forcing feeds the decoder the target sequence itself (dec_in = y) instead of y shifted right by "
          "one step (last observed value, then y[:, :-1]), so at step t the decoder is given the value it must "
          "predict and learns to copy it; autoregressive forecasts then stay flat.",
      cause_pattern=r"shift\w*.{0,40}(right|by one|one step|by 1)|(not|un)[- ]?shifted|decoder (input|inputs?) (is|"
                    r"are|equals?|contain\w*|includ\w*).{0,40}(target|label|answer|value it)|(sees|given|fed|feeds|"
                    r"receives) (the )?(value|target|answer|label)s? (it|they) (must|should|has to|have to|is to) "
                    r"predict|teacher[- ]forc\w*.{0,80}(leak|cop(y|ies)|same|identical|shift)|dec\w*_in\w* ?= ?y\b")
def seq2seq_teacher_forcing_unshifted(fixed: bool = False):
    seed(0)
    s = sine_series(60, 100, s=24)
    model = Seq2SeqForecaster()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(_seq2seq_batches(s[:48], 24, 8, fixed), 64), loss_fn=teacher_forced_mse,
                val_loader=loader(_seq2seq_batches(s[48:], 24, 8, fixed), 256, shuffle=False), max_steps=300)


fix("seq2seq_teacher_forcing_unshifted", fixed_of(seq2seq_teacher_forcing_unshifted),
    rmse_on(own_val, lambda m, b: (m.forecast(b[0], b[2].shape[1]), b[2])), "autoregressive 8-step RMSE",
    higher=False)


def _tag_clips(n, s, n_tags=6, F_=24):
    """Clips' time-averaged log-mel profiles (n, F_) and multi-hot event tags (n, n_tags): tag k adds a band."""
    g = gen(s)
    tags = (torch.rand(n, n_tags, generator=g) < 0.4).float()
    bins = torch.arange(F_).float()
    bands = torch.exp(-((bins[None, :] - (2 + 4 * torch.arange(n_tags).float())[:, None]) ** 2) / 2.0)
    x = tags @ bands * (0.8 + 0.4 * torch.rand(n, 1, generator=g)) + 0.3 * torch.randn(n, F_, generator=g)
    return x, tags


@case("multilabel_tags_crossentropy", "targets",
      bug="Multi-hot sound-event tags (several events per clip) are trained with nn.CrossEntropyLoss, whose softmax "
          "makes the tags compete for one unit of probability, instead of nn.BCEWithLogitsLoss with one sigmoid per "
          "tag.",
      cause_pattern=r"multi[- ]?(label|hot)|(one|a) sigmoid (per|for each) (tag|label|class)|(tags?|labels?|events?) "
                    r"(compete|are not mutually exclusive|can co-?occur|co-?occur)|not mutually exclusive|more than one "
                    r"(tag|label|class|positive|event)|several (tags|labels|events|positives) (per|in (a|each|one))")
def multilabel_tags_crossentropy(fixed: bool = False):
    seed(0)
    x, y = _tag_clips(1500, s=25)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 64),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 300, shuffle=False), max_steps=300)


def _exact_match(model, kw):
    def fn(m, b):
        pred = (torch.sigmoid(m(b[0])) > 0.5).float()
        return (pred == b[1]).all(-1).sum().item(), len(b[1])
    return mean_over(model, kw["val_loader"], fn)


fix("multilabel_tags_crossentropy", fixed_of(multilabel_tags_crossentropy), _exact_match,
    "exact-match tag-set accuracy (sigmoid > 0.5)")


def _recording(n_samples, s):
    """One long 3-axis recording with per-sample activity labels in segments of 150-300 samples."""
    g = gen(s)
    labels, pos = [], 0
    while pos < n_samples:
        seg = int(torch.randint(150, 300, (1,), generator=g))
        labels.append(torch.full((seg,), int(torch.randint(0, 4, (1,), generator=g))))
        pos += seg
    lab = torch.cat(labels)[:n_samples]
    f = 0.03 + 0.04 * lab.float()
    phase = torch.cumsum(TAU * f, 0)
    x = torch.stack([torch.sin(phase + k) for k in range(3)], 1) + 0.5 * torch.randn(n_samples, 3, generator=g)
    return x, lab


class StridedWindows(Dataset):
    def __init__(self, x, lab, w, stride, fixed):
        self.x, self.lab, self.w, self.stride, self.fixed = x, lab, w, stride, fixed

    def __len__(self):
        return (len(self.x) - self.w) // self.stride

    def __getitem__(self, k):
        start = k * self.stride
        win = self.x[start:start + self.w].T                     # (channels, time) for Conv1d
        y = self.lab[start + self.w // 2] if self.fixed else self.lab[k]
        return win, y


@case("har_window_label_not_strided", "targets",
      bug="Window k starts at sample k * stride of the recording but its label is read as labels[k], the per-sample "
          "label at index k, instead of labels[k * stride + window // 2], so windows carry the labels of the first "
          "seconds of the recording.",
      cause_pattern=r"labels?\[\s*(k|i|idx|index)\s*\]|labels?\[\s*(k|i|idx|index)\s*\*\s*stride|stride.{0,60}"
                    r"(label|index)|missing (the )?stride|(window|segment) (index|number).{0,60}(instead of|rather than|used as|as|not)"
                    r" (a |the )?"
                    r"(sample|time|frame) (index|position)|(labels?|targets?).{0,40}(misaligned|not aligned|out of "
                    r"step|wrong (time|position|offset))|(centre|center|middle|majority).{0,30}(of the )?window")
def har_window_label_not_strided(fixed: bool = False):
    seed(0)
    xt, lt = _recording(30000, s=26)
    xv, lv = _recording(6000, s=27)

    model = nn.Sequential(nn.Conv1d(3, 16, 7, padding=3), nn.ReLU(), nn.Conv1d(16, 16, 5, padding=2), nn.ReLU(),
                          nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(StridedWindows(xt, lt, 64, 32, fixed), 64), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(StridedWindows(xv, lv, 64, 32, fixed), 200, shuffle=False), max_steps=300)


fix("har_window_label_not_strided", fixed_of(har_window_label_not_strided),
    acc_on(truth_val(har_window_label_not_strided)), "val accuracy (centre labels)")
