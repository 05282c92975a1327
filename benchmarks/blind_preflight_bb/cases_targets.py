"""Set bb, family targets: what the loss is asked to predict."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_bb.registry import acc_of, case, fix, fixed_of, seed
from benchmarks.blind_preflight_bb.synth import log_spec, markov_sessions, tensors, tone_clips

# ---------------------------------------------------------------- 1. next-item targets not shifted


class SeqGRU(nn.Module):
    def __init__(self, n_items, d=48):
        super().__init__()
        self.emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, n_items + 1)

    def forward(self, seq):  # (B, T) -> (B, T, V): a prediction at every position
        return self.out(self.gru(self.emb(seq))[0])


def per_position_loss(model, batch):
    seq, target = batch
    logits = model(seq)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def last_position(m, b):
    seq, target = b
    return m(seq)[:, -1].argmax(-1), target[:, -1]


@case("gru4rec_targets_not_shifted", "targets",
      "The per-position next-item loss uses the session itself as the target (targets = seq, inputs = seq) instead of "
      "inputs = seq[:, :-1] and targets = seq[:, 1:], so the GRU learns to echo the current item rather than predict "
      "the next one.",
      r"shift|offset by one|seq\[:, ?1:\]|\[:, ?:-1\]|next[- ](item|token|step|position)|same as (the )?input|"
      r"(target|label)s?.{0,40}(equal|identical|same as|copy of|=).{0,30}input|input.{0,30}(equal|identical|same as)"
      r".{0,30}(target|label)|predict(s|ing)? the (current|same|input)|copy|identity")
def gru4rec_targets_not_shifted(fixed=False):
    seed(0)
    full = markov_sessions(2000, 40, 13, 11)
    val = (full[1600:, :-1], full[1600:, 1:])
    train = (full[:1600, :-1], full[:1600, 1:]) if fixed else (full[:1600, :-1], full[:1600, :-1])
    model = SeqGRU(40)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=tensors(*train), loss_fn=per_position_loss,
                val_loader=tensors(*val, shuffle=False), max_steps=300)


fix("gru4rec_targets_not_shifted", fixed_of(gru4rec_targets_not_shifted), acc_of(last_position),
    "val next-item accuracy")

# ---------------------------------------------------------------- 2. sampled softmax: positive in the wrong column


class LastItemTower(nn.Module):
    def __init__(self, n_items, d=32):
        super().__init__()
        self.emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.items = nn.Embedding(n_items + 1, d)

    def forward(self, seq):  # full-catalogue scores (B, V + 1)
        return self.gru(self.emb(seq))[0][:, -1] @ self.items.weight.T

    def user(self, seq):
        return self.gru(self.emb(seq))[0][:, -1]


def sampled_softmax(positive_first, n_items, k=20):
    def loss(model, batch):
        seq, pos = batch
        u = model.user(seq)
        neg = torch.randint(1, n_items + 1, (seq.shape[0], k), device=seq.device)
        pos_score = (u * model.items(pos)).sum(-1, keepdim=True)
        neg_score = torch.einsum("bd,bkd->bk", u, model.items(neg))
        logits = torch.cat([pos_score, neg_score], 1) if positive_first else torch.cat([neg_score, pos_score], 1)
        zeros = torch.zeros(seq.shape[0], dtype=torch.long, device=seq.device)  # "the positive is class 0"
        return F.cross_entropy(logits, zeros)
    return loss


@case("sampled_softmax_positive_last_column", "targets",
      "The sampled-softmax logits are built as cat([negative scores, positive score]) but the target is class 0 for "
      "every row, so the loss rewards the first sampled negative and pushes the true next item down.",
      r"(positive|true item|target item).{0,80}(column|index|position|class) ?(0|zero)?|(column|index|class) ?(0|zero)"
      r".{0,80}(negative|positive)|cat\(\[neg|order of (the )?(concat|cat)|labels?.{0,40}zeros.{0,60}"
      r"(positive|negative)|(target|label)s?.{0,40}(point|refer).{0,30}negative|wrong (column|class|index)")
def sampled_softmax_positive_last_column(fixed=False):
    seed(0)
    full = markov_sessions(3000, 200, 7, 12)
    seq, target = full[:, :6], full[:, 6]
    model = LastItemTower(200)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=tensors(seq[:2400], target[:2400]), loss_fn=sampled_softmax(fixed, 200),
                val_loader=tensors(seq[2400:], target[2400:], shuffle=False), max_steps=300)


fix("sampled_softmax_positive_last_column", fixed_of(sampled_softmax_positive_last_column),
    acc_of(lambda m, b: (m(b[0])[:, 1:].argmax(-1) + 1, b[1])), "val full-catalogue next-item accuracy")

# ---------------------------------------------------------------- 3. label map built per split


WORDS = ["down", "go", "left", "no", "off", "on", "right", "stop", "up", "yes"]


class SpecCNN(nn.Module):
    def __init__(self, n_cls):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(32, 48, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool1d(1), nn.Flatten(),
                                 nn.Linear(48, n_cls))

    def forward(self, x):
        return self.net(x)


@case("kws_label_map_per_split", "targets",
      "The training set concatenates two recording folders, and each folder's Dataset builds its own label map from "
      "sorted(set(words in that folder)); the second folder has no 'go' clips, so there every word after 'go' gets an "
      "index one lower than in the first folder and half the training labels contradict the other half.",
      r"(label|class)[ _-]?(map|index|encod|vocab|dict|to[ _-]?id|2id|mapping).{0,80}(split|folder|dataset|shard|"
      r"separate|each|differ|consistent|shared|same|per)|(separate|different|own|per[- ](split|folder|dataset)|"
      r"inconsisten).{0,40}(label|class)[ _-]?(map|index|encod|mapping|ids?)|LabelEncoder|sorted\(set|"
      r"shifted by one|off[- ]by[- ]one|(contradict|conflict)ing labels")
def kws_label_map_per_split(fixed=False):
    seed(0)
    wav, y = tone_clips(1800, 10, 13)
    x = log_spec(wav)
    x = (x - x.mean()) / x.std()
    full_map = {w: i for i, w in enumerate(WORDS)}
    b_idx = torch.nonzero(y[700:1400] != WORDS.index("go")).squeeze(1) + 700  # folder B has no 'go' clips

    def folder_labels(idx):
        words = [WORDS[i] for i in y[idx]]
        own = full_map if fixed else {w: i for i, w in enumerate(sorted(set(words)))}
        return torch.tensor([own[w] for w in words])

    a_idx = torch.arange(700)
    x_train = torch.cat([x[a_idx], x[b_idx]])
    y_train = torch.cat([folder_labels(a_idx), folder_labels(b_idx)])
    model = SpecCNN(10)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3),
                train_loader=tensors(x_train, y_train), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(x[1400:], y[1400:], shuffle=False), max_steps=300)


fix("kws_label_map_per_split", fixed_of(kws_label_map_per_split),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")

# ---------------------------------------------------------------- 4. frame labels cropped instead of strided


class StridedVAD(nn.Module):
    """Frame-level activity detector with a stride-4 front end: T input frames -> T / 4 output frames."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(32, 48, 4, stride=4), nn.ReLU(), nn.Conv1d(48, 1, 1))

    def forward(self, x):  # (B, 32, T) -> (B, T/4) logits
        return self.net(x)[:, 0]


def vad_data(n, s, frames=64):
    g = torch.Generator().manual_seed(s)
    x = -4 + 0.5 * torch.randn(n, 32, frames, generator=g)
    y = torch.zeros(n, frames)
    for i in range(n):
        for _ in range(3):
            a = int(torch.randint(0, frames - 8, (1,), generator=g))
            length = int(torch.randint(4, 12, (1,), generator=g))
            y[i, a:a + length] = 1
    band = torch.randint(4, 28, (n, 1, 1), generator=g)
    x = x + 4 * y[:, None, :] * (torch.arange(32)[None, :, None] - band).abs().le(1).float()
    return x, y


def vad_loss(strided):
    def loss(model, batch):
        x, y = batch
        logits = model(x)
        target = y[:, ::4] if strided else y[:, : logits.shape[1]]  # crop the labels to the output length
        return F.binary_cross_entropy_with_logits(logits, target)
    return loss


@case("vad_frame_labels_cropped", "targets",
      "The detector's stride-4 front end gives T/4 output frames, and the frame labels are cropped to that length "
      "(y[:, :T//4]) instead of being subsampled (y[:, ::4]), so output frame j is trained on the label of input frame "
      "j, a quarter of the way through the clip from where it looks.",
      r"(crop|truncat|slic)\w*.{0,60}(label|target)|(label|target).{0,60}(crop|truncat|misalign|align|subsampl|"
      r"downsampl|stride|resolution|frame rate)|stride.{0,60}(label|target)|::4|(subsampl|downsampl|pool).{0,40}"
      r"(label|target)|misalign|frame rate")
def vad_frame_labels_cropped(fixed=False):
    seed(0)
    x, y = vad_data(1500, 14)
    model = StridedVAD()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=tensors(x[:1200], y[:1200]), loss_fn=vad_loss(fixed),
                val_loader=tensors(x[1200:], y[1200:], shuffle=False), max_steps=300)


fix("vad_frame_labels_cropped", fixed_of(vad_frame_labels_cropped),
    acc_of(lambda m, b: ((m(b[0]) > 0).long(), b[1][:, ::4].long())), "val frame accuracy")

# ---------------------------------------------------------------- 5. silence folded into unknown

KWS_LABELS = ["yes", "no", "up", "down", "_silence_", "_unknown_"]


def kws6(n, s):
    g = torch.Generator().manual_seed(s)
    wav_w, y_w = tone_clips(n, 4, s)                       # words 0-3: tones 500-1250 Hz
    wav_u, _ = tone_clips(n, 4, s + 1, base=1750.0)       # unknown: tones 1750-2500 Hz
    noise = 0.3 * torch.randn(n, wav_w.shape[1], generator=g)
    kind = torch.randint(0, 6, (n,), generator=g)
    kind = torch.where(kind < 4, y_w, kind)
    wav = torch.where((kind < 4)[:, None], wav_w, torch.where((kind == 4)[:, None], noise, wav_u))
    folder = [KWS_LABELS[i] if i < 4 else ("_background_noise_" if i == 4 else "other") for i in kind]
    return wav, kind, folder


@case("kws_silence_folded_into_unknown", "targets",
      "Labels come from label_to_index.get(folder, UNKNOWN); the silence clips live in the folder "
      "'_background_noise_', not '_silence_', so they are all labelled _unknown_ and the _silence_ class is never a "
      "target.",
      r"silence.{0,80}(unknown|never|missing|absent|no (training )?(example|sample|target)|mapped|label)|"
      r"(unknown|catch[- ]all|default).{0,80}silence|\.get\(.{0,40}(unknown|default)|(class|label)s?.{0,40}never"
      r".{0,30}(appear|occur|present|seen|target)|(class|label).{0,40}(no|zero) (training )?(example|sample)|"
      r"_background_noise_")
def kws_silence_folded_into_unknown(fixed=False):
    seed(0)
    wav, truth, folder = kws6(1800, 15)
    x = log_spec(wav)
    x = (x - x.mean()) / x.std()
    label_to_index = {w: i for i, w in enumerate(KWS_LABELS)}
    if fixed:
        label_to_index["_background_noise_"] = label_to_index["_silence_"]
    y_train = torch.tensor([label_to_index.get(f, label_to_index["_unknown_"]) for f in folder[:1400]])
    model = SpecCNN(6)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3),
                train_loader=tensors(x[:1400], y_train), loss_fn=nn.CrossEntropyLoss(),
                val_loader=tensors(x[1400:], truth[1400:], shuffle=False), max_steps=300)


fix("kws_silence_folded_into_unknown", fixed_of(kws_silence_folded_into_unknown),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")
