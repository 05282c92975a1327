"""Set bb, family data: what the features and sessions look like by the time they reach the model."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_bb.registry import acc_of, case, fix, fixed_of, gen, seed
from benchmarks.blind_preflight_bb.synth import SR, decimate2, log_spec, markov_sessions, tensors, tone_clips


def argmax_acc():
    return acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))


class SpecNet(nn.Module):
    def __init__(self, n_cls, bands=32):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(bands, 48, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
                                 nn.Flatten(), nn.Linear(48, n_cls))

    def forward(self, x):
        return self.net(x)


# ---------------------------------------------------------------- 1. per-clip normalisation removes the level cue


def level_clips(n, s):
    """Alarm distance classes (near / mid / far) that differ by level only: the log-mel is shifted by the class's dB."""
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    shape = torch.randn(n, 32, 1, generator=g) + 0.5 * torch.randn(n, 32, 24, generator=g)
    return shape + 2.5 * y.float()[:, None, None] - 4, y


@case("alarm_per_clip_normalisation", "data",
      "Each log-mel clip is standardised by its own mean and std ((x - x.mean()) / x.std() per clip), which removes the "
      "overall level, the only cue that separates near, mid and far alarms; the statistics should come from the whole "
      "training set.",
      r"per[- ](clip|sample|instance|example|utterance)|(each|every|its own) (clip|sample|example|utterance)"
      r".{0,60}(mean|std|normali[sz]|standardi[sz])|(instance|utterance)[- ]?(level )?normali[sz]|(level|loudness|"
      r"gain|energy|volume|absolute).{0,80}(remov|lost|destroy|erase|discard)|(dataset|global|training[- ]set)"
      r"[- ](wide )?(mean|statistic|normali[sz])")
def alarm_per_clip_normalisation(fixed=False):
    seed(0)
    x, y = level_clips(1500, 41)
    if fixed:
        x = (x - x[:1200].mean()) / x[:1200].std()
    else:
        x = (x - x.mean(dim=(1, 2), keepdim=True)) / x.std(dim=(1, 2), keepdim=True)
    model = SpecNet(3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3),
                train_loader=tensors(x[:1200], y[:1200]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(x[1200:], y[1200:], shuffle=False), max_steps=300)


fix("alarm_per_clip_normalisation", fixed_of(alarm_per_clip_normalisation), argmax_acc(), "val accuracy")

# ---------------------------------------------------------------- 2. 16 kHz training clips read as 8 kHz


@case("kws_train_audio_not_resampled", "data",
      "The training clips were recorded at 16 kHz and are loaded without resampling into a pipeline (STFT bands, "
      "validation clips) built for 8 kHz, so every training tone sits at half its frequency in the features; the "
      "validation clips are 8 kHz and fall in bands the model never saw for their class.",
      r"resampl|sample[ _-]?rate|sampling[ _-]?rate|\bsr\b|16 ?k(hz)?.{0,40}8 ?k|8 ?k(hz)?.{0,40}16 ?k|orig_freq|"
      r"(half|double|twice) (the )?frequenc|frequenc.{0,40}(shift|scal|halv|doubl)")
def kws_train_audio_not_resampled(fixed=False):
    seed(0)
    wav16, y_train = tone_clips(1200, 8, 42, length=2 * 3968, src_sr=2 * SR)   # 16 kHz recordings
    wav_train = decimate2(wav16) if fixed else wav16[:, :3968]
    wav_val, y_val = tone_clips(400, 8, 43)                                     # 8 kHz, as the pipeline expects
    x_train, x_val = log_spec(wav_train), log_spec(wav_val)
    mu, sd = x_train.mean(), x_train.std()
    model = SpecNet(8)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3),
                train_loader=tensors((x_train - mu) / sd, y_train), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors((x_val - mu) / sd, y_val, shuffle=False), max_steps=300)


fix("kws_train_audio_not_resampled", fixed_of(kws_train_audio_not_resampled), argmax_acc(), "val accuracy")

# ---------------------------------------------------------------- 3. clips cropped to the first second


def long_clips(n, s, length=3 * 3968, event=3968):
    """3-second recordings with one 1-second keyword (a tone) at a random place, background noise elsewhere."""
    g = gen(s)
    tone, y = tone_clips(n, 8, s, length=event, noise=0.0)
    wav = 0.3 * torch.randn(n, length, generator=g)
    start = torch.randint(0, length - event, (n,), generator=g)
    for i in range(n):
        wav[i, start[i]:start[i] + event] += tone[i]
    return wav, y


def crop(wav, centred, size=3968):
    if not centred:
        return wav[:, :size]                                     # "take the first second"
    energy = wav.pow(2).unfold(1, size, 256).mean(-1)            # the loudest 1 s window
    start = energy.argmax(1) * 256
    return torch.stack([w[s:s + size] for w, s in zip(wav, start.tolist())])


@case("kws_crop_first_second", "data",
      "Three-second recordings are cut to a fixed one-second length with wav[:, :16000]-style cropping of the first "
      "second, but the keyword sits anywhere in the recording, so most clips lose all or part of their keyword and "
      "keep mostly noise under the keyword's label.",
      r"crop|truncat|trim|first (second|\d+ samples)|fixed[- ]length|cut (off|out)|(keyword|event|speech).{0,60}"
      r"(outside|missing|lost|removed|not in)|pad(ding)? or (crop|trim)|window.{0,40}(energy|centre|center)")
def kws_crop_first_second(fixed=False):
    seed(0)
    wav, y = long_clips(1500, 44)
    x = log_spec(crop(wav, centred=fixed))
    x = (x - x[:1200].mean()) / x[:1200].std()
    model = SpecNet(8)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3),
                train_loader=tensors(x[:1200], y[:1200]), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(x[1200:], y[1200:], shuffle=False), max_steps=300)


fix("kws_crop_first_second", fixed_of(kws_crop_first_second), argmax_acc(), "val accuracy")

# ---------------------------------------------------------------- 4. item id 0 is also the padding id


class MaskedMeanRec(nn.Module):
    """Attention-free session encoder: embeddings of the non-padding items, last two concatenated."""

    def __init__(self, n_ids, d=32):
        super().__init__()
        self.emb = nn.Embedding(n_ids, d, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(2 * d, 128), nn.ReLU(), nn.Linear(128, n_ids))

    def forward(self, seq):  # left-padded (B, T), padding id 0
        return self.mlp(torch.cat([self.emb(seq[:, -1]), self.emb(seq[:, -2])], -1))


def popularity_ranked_sessions(n, n_items, s):
    """Ids are popularity ranks: id 0 is the most popular item; next item = table[last, second last]."""
    g = gen(s)
    q = 1.0 / torch.arange(1, n_items + 1).float()
    seq = torch.multinomial(q / q.sum(), n * 6, replacement=True, generator=g).view(n, 6)
    table = torch.multinomial(q / q.sum(), n_items * n_items, replacement=True, generator=gen(s + 1))
    target = table.view(n_items, n_items)[seq[:, -1], seq[:, -2]]
    return seq, target


@case("item_zero_is_padding_id", "data",
      "Item ids are popularity ranks starting at 0, and 0 is also the padding id: nn.Embedding(padding_idx=0) keeps "
      "the most popular item's embedding at zero, like padding, and CrossEntropyLoss(ignore_index=0) drops every "
      "target that is that item; item ids should start at 1.",
      r"(item|id)s?.{0,40}(0|zero).{0,80}(pad|padding)|(pad|padding)[_ ]?(id|idx|index|token)?.{0,80}"
      r"(real|actual|valid|most popular|collid|same as|clash|overlap).{0,40}(item|id)|padding_idx|ignore_index ?= ?0|"
      r"(shift|offset|start).{0,30}(ids?|items?).{0,30}(by )?(1|one)|\+ ?1.{0,30}(id|item)|reserve.{0,30}(0|zero)")
def item_zero_is_padding_id(fixed=False):
    seed(0)
    seq, target = popularity_ranked_sessions(4000, 40, 45)
    if fixed:
        seq, target = seq + 1, target + 1
    model = MaskedMeanRec(41)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=tensors(seq[:3200], target[:3200]), loss_fn=nn.CrossEntropyLoss(ignore_index=0),
                val_loader=tensors(seq[3200:], target[3200:], shuffle=False), max_steps=300)


def item_acc(m, kw):
    """Accuracy over all val targets (item 0 included when ids start at 0)."""
    right = n = 0
    m.eval()
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            right += (m(x).argmax(-1) == y).sum().item()
            n += len(y)
    m.train()
    return right / n


fix("item_zero_is_padding_id", fixed_of(item_zero_is_padding_id), item_acc, "val next-item accuracy (all targets)")

# ---------------------------------------------------------------- 5. sessions ordered by item id, not by time


class OrderGRU(nn.Module):
    def __init__(self, n_items, d=48):
        super().__init__()
        self.emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, n_items + 1)

    def forward(self, seq):
        return self.out(self.gru(self.emb(seq))[0][:, -1])


@case("sessions_sorted_by_item_not_time", "data",
      "The click log is grouped into sessions after sort_values(['session_id', 'item_id']) instead of "
      "['session_id', 'timestamp'], so each training session lists its items by id, not in the order they were "
      "clicked; the last input is the largest id, not the last click, and the time-ordered validation sessions look "
      "nothing like it.",
      r"sort|order(ed|ing)? (by|of)|timestamp|chronolog|time order|temporal order|(click|event|interaction)s? "
      r"order|not in (the )?order")
def sessions_sorted_by_item_not_time(fixed=False):
    seed(0)
    full = markov_sessions(3000, 40, 7, 46)
    seq, target = full[:, :6], full[:, 6]
    train_seq = seq[:2400] if fixed else torch.sort(full[:2400], dim=1).values[:, :6]
    train_target = target[:2400] if fixed else torch.sort(full[:2400], dim=1).values[:, 6]
    model = OrderGRU(40)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=tensors(train_seq, train_target), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(seq[2400:], target[2400:], shuffle=False), max_steps=300)


fix("sessions_sorted_by_item_not_time", fixed_of(sessions_sorted_by_item_not_time), argmax_acc(),
    "val next-item accuracy")
