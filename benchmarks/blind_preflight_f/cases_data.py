"""Set f, family `data`: loaders, samplers, splits, preprocessing, augmentation, collate, tokenisation."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_f.registry import case, loader, seed, teacher_classes

# --------------------------------------------------------------------------- 1: a keras.utils.Sequence port


class RecordSequence(Dataset):
    """Ported from a keras.utils.Sequence."""

    def __init__(self, x, y, batch_size=32):
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return len(self.x) // self.batch_size

    def __getitem__(self, idx):
        return self.x[idx], self.y[idx]


def noisy_teacher(n, d, c, s, flip=0.05):
    x, y = teacher_classes(n, d, c, s=s)
    g = torch.Generator().manual_seed(s + 1)
    flips = torch.rand(n, generator=g) < flip
    y[flips] = torch.randint(0, c, (int(flips.sum()),), generator=g)
    return x, y


@case("keras_sequence_port_len_counts_batches", "data",
      "the Dataset was ported from a keras.utils.Sequence and kept __len__ = len(x) // batch_size (the number of "
      "batches) while __getitem__ now returns one record: the DataLoader's sampler only ever draws indices "
      "0..99, so training sees 100 of the 3200 records and overfits them",
      r"__len__|len\((the )?dataset\)|(only|just)[^.]*(first|\d+ of|fraction|subset|part|\d+ (distinct|unique))[^.]*(samples|examples|rows|records|items|dataset|data|indices)|(samples?|examples?|rows?|records?|items?)[^.]*(never (drawn|seen|sampled|used|visited)|unused|unreachable)|length of the dataset|(dataset|loader)[^.]*(too short|shorter than)")
def keras_sequence_port_len_counts_batches():
    seed(0)
    x, y = noisy_teacher(3700, 32, 4, s=41)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(RecordSequence(x[:3200], y[:3200]), 32),
                val_loader=loader(TensorDataset(x[3200:], y[3200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 2: in-place normalisation in __getitem__


class MeterReadings(Dataset):
    def __init__(self, x, y, mean, std):
        self.x, self.y, self.mean, self.std = x, y, mean, std

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i]
        x.sub_(self.mean).div_(self.std)
        return x, self.y[i]


@case("meter_dataset_normalises_in_place_each_access", "data",
      "__getitem__ standardises with x = self.x[i]; x.sub_(mean).div_(std): self.x[i] is a view of the stored "
      "table, so the in-place ops rewrite the dataset; every epoch standardises the already standardised rows again, "
      "after two or three epochs every input has collapsed to the same constant (-mean / (std - 1)) and the model "
      "loses everything it learned",
      r"in.?place|mutat|(dataset|stored|cached|underlying|source) (data|tensor|table|rows?|values?)?[^.]*(modif|chang|overwrit|altered|rewrit|drift)|sub_|div_|(repeated(ly)?|twice|again|every (access|epoch|call|time))[^.]*(normali[sz]|standardi[sz]|transform|applied)|compound|(inputs?|batches?|features?)[^.]*(differ|change|drift)[^.]*(epoch|pass|between)")
def meter_dataset_normalises_in_place_each_access():
    seed(0)
    x, y = teacher_classes(3000, 12, 3, s=42)
    x = x * 10 + 50
    mean, std = x[:2560].mean(0), x[:2560].std(0)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(MeterReadings(x[:2560].clone(), y[:2560], mean, std), 64),
                val_loader=loader(MeterReadings(x[2560:].clone(), y[2560:], mean, std), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 3: vocabulary ids from 0, padding 0


TICKET_WORDS = {
    0: ["account"],                          # account
    1: ["invoice", "charge", "billing"],     # billing
    2: ["package", "delivery", "tracking"],  # shipping
    3: [],                                   # general
}
COMMON = ["please", "help", "my", "with", "urgent", "issue", "thanks", "today", "need", "since", "login", "email",
          "update", "question", "problem", "hello"]


def tickets(n=3000, s=0):
    g = torch.Generator().manual_seed(s)
    texts, labels = [], []
    for _ in range(n):
        c = int(torch.randint(0, 4, (1,), generator=g))
        k = int(torch.randint(4, 9, (1,), generator=g))
        words = [COMMON[int(i)] for i in torch.randint(0, len(COMMON), (k,), generator=g)]
        if TICKET_WORDS[c]:
            key = TICKET_WORDS[c][int(torch.randint(0, len(TICKET_WORDS[c]), (1,), generator=g))]
            words.insert(int(torch.randint(0, k + 1, (1,), generator=g)), key)
        texts.append(" ".join(words))
        labels.append(c)
    return texts, torch.tensor(labels)


def build_vocab(texts):
    return {w: i for i, w in enumerate(sorted({w for t in texts for w in t.split()}))}


def encode(texts, vocab, T=12):
    ids = [[vocab[w] for w in t.split()][:T] for t in texts]
    return torch.tensor([row + [0] * (T - len(row)) for row in ids])


class TicketRouter(nn.Module):
    def __init__(self, vocab, d=32, classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, ids):
        mask = (ids != 0).unsqueeze(-1).float()
        pooled = (self.embed(ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.mlp(pooled)


@case("ticket_vocab_ids_start_at_0_shared_with_padding", "data",
      "the vocabulary is {w: i for i, w in enumerate(sorted(words))}, so the first word alphabetically, 'account', "
      "gets id 0, which is also the padding id (sequences padded with 0, Embedding(padding_idx=0), pooling mask "
      "ids != 0): the one word that marks account tickets is treated as padding everywhere and account tickets "
      "cannot be told from general ones (start real ids at 2, after [PAD] and [UNK])",
      r"(pad|padding)[^.]*(id|index|token|value)[^.]*(real|same|collid|shared|also|word|vocab)|(real|vocab\w*) (word|token)s?[^.]*(id|index) 0|padding_idx|vocab\w*[^.]*(start|begin)s?[^.]*\b0\b|(word|token)s?[^.]*(masked|treated as padding|ignored as padding)|\bid 0\b")
def ticket_vocab_ids_start_at_0_shared_with_padding():
    seed(0)
    texts, y = tickets(s=43)
    vocab = build_vocab(texts[:2560])
    ids = encode(texts, vocab)
    model = TicketRouter(len(vocab))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(ids[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 4: segmentation masks resized bilinearly


def rectangle_scenes(n=1200, size=32, s=0):
    g = torch.Generator().manual_seed(s)
    imgs = 0.1 * torch.randn(n, 3, size, size, generator=g)
    masks = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        for _ in range(int(torch.randint(1, 3, (1,), generator=g))):
            k = int(torch.randint(1, 4, (1,), generator=g))
            h, w = torch.randint(5, 13, (2,), generator=g).tolist()
            r, c = int(torch.randint(0, size - h, (1,), generator=g)), int(torch.randint(0, size - w, (1,), generator=g))
            imgs[i, :, r:r + h, c:c + w] = 0.1 * torch.randn(3, h, w, generator=g)
            imgs[i, k - 1, r:r + h, c:c + w] += 1.0
            masks[i, r:r + h, c:c + w] = k
    return imgs, masks


class SmallScenes(Dataset):
    """Scenes resized once to 16x16 to keep the epochs fast."""

    def __init__(self, imgs, masks, size=16):
        self.imgs = F.interpolate(imgs, size=size, mode="bilinear", align_corners=False)
        self.masks = F.interpolate(masks[:, None].float(), size=size, mode="bilinear", align_corners=False)[:, 0].long()

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        return self.imgs[i], self.masks[i]


def seg_net(classes=4, c=24):
    return nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(c, classes, 1))


@case("scene_masks_downsampled_bilinear_then_truncated", "data",
      "the label masks are downsampled with the images' F.interpolate(mode='bilinear') and cast back with .long(): "
      "along every object edge the class ids are averaged and truncated, so the border of a class-3 object is "
      "labelled 1 or 2 (classes that are not there), the border of class 2 becomes 1 and class-1 borders vanish into "
      "background; the net learns these fake rims (masks need mode='nearest')",
      r"interpolat|bilinear|nearest|resiz|downsampl|(mask|label|target)s?[^.]*(fraction|non.?integer|intermediate|new class|blend|averag|invalid|truncat)|class(es)? (that )?(do not|don't|never) (exist|appear)")
def scene_masks_downsampled_bilinear_then_truncated():
    seed(0)
    imgs, masks = rectangle_scenes(s=44)
    model = seg_net()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(SmallScenes(imgs[:1000], masks[:1000]), 32),
                val_loader=loader(SmallScenes(imgs[1000:], masks[1000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 5: stop-word list that drops negations


POS = ["good", "great", "tasty", "friendly", "fresh"]
NEG = ["bad", "awful", "bland", "rude", "stale"]
FILLER = ["the", "food", "was", "service", "staff", "really", "meal", "place", "and", "it", "is", "very", "our",
          "dinner", "a", "of"]
STOPWORDS = {"a", "an", "the", "and", "or", "of", "is", "was", "it", "very", "our", "not", "no", "nor", "to", "in"}


def restaurant_reviews(n=3000, s=0, negation_rate=0.4):
    g = torch.Generator().manual_seed(s)
    texts, labels = [], []
    for _ in range(n):
        positive = bool(torch.rand(1, generator=g) < 0.5)
        negated = bool(torch.rand(1, generator=g) < negation_rate)
        words = [FILLER[int(i)] for i in torch.randint(0, len(FILLER), (int(torch.randint(3, 7, (1,), generator=g)),),
                                                       generator=g)]
        sentiment = (POS if positive else NEG)[int(torch.randint(0, 5, (1,), generator=g))]
        words += (["not"] if negated else []) + [sentiment]
        texts.append(" ".join(words))
        labels.append(int(positive != negated))
    return texts, torch.tensor(labels)


def preprocess(text):
    return [w for w in text.lower().split() if w not in STOPWORDS]


def encode_tokens(token_lists, vocab, T=10):
    rows = [[vocab.get(w, 1) for w in toks][:T] for toks in token_lists]
    return torch.tensor([r + [0] * (T - len(r)) for r in rows])


class ReviewGRU(nn.Module):
    def __init__(self, vocab, d=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * d, 2)

    def forward(self, ids):
        return self.head(self.gru(self.embed(ids))[0].max(dim=1).values)


@case("review_stopword_list_removes_negations", "data",
      "the preprocessing drops an NLTK-style stop-word list that contains 'not', 'no' and 'nor': 'the food was not "
      "good' becomes 'food good', identical to a positive review, so the 40% negated reviews carry the opposite label "
      "of identical inputs and the sentiment cannot be learned for them (keep negations out of the stop list)",
      r"stop.?words?|negat|\bnot\b[^.]*(removed|dropped|stripped|filtered)|(removed|dropped|filtered)[^.]*\bnot\b|(identical|same|duplicate) (inputs?|sequences?|rows?|texts?|samples?)[^.]*(different|conflicting|opposite|both) labels?|(conflicting|contradict\w*|inconsistent) labels")
def review_stopword_list_removes_negations():
    seed(0)
    texts, y = restaurant_reviews(s=45)
    tokens = [preprocess(t) for t in texts]
    vocab = {w: i + 2 for i, w in enumerate(sorted({w for t in tokens[:2560] for w in t}))}
    ids = encode_tokens(tokens, vocab)
    model = ReviewGRU(len(vocab) + 2)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(ids[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(ids[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 6: each window standardised on its own


def room_windows(n=3000, T=32, s=0):
    """Temperature / humidity / CO2 windows; label: the room is overheating (mean temperature above 22 C)."""
    g = torch.Generator().manual_seed(s)
    level = 18 + 8 * torch.rand(n, 1, generator=g)
    t = torch.arange(T).float()
    temp = level + 0.5 * torch.sin(t / 5 + 6.28 * torch.rand(n, 1, generator=g)) + 0.3 * torch.randn(n, T, generator=g)
    hum = 40 + torch.cumsum(torch.randn(n, T, generator=g), 1)
    co2 = 600 + 50 * torch.randn(n, 1, generator=g) + 20 * torch.randn(n, T, generator=g)
    return torch.stack([temp, hum, co2], -1), (level.squeeze(1) > 22).long()


class RoomWindows(Dataset):
    def __init__(self, windows, labels):
        self.windows, self.labels = windows, labels

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, i):
        w = self.windows[i]
        w = (w - w.mean(0)) / (w.std(0) + 1e-6)
        return w.flatten(), self.labels[i]


@case("room_sensor_windows_standardised_per_window", "data",
      "each 32-step sensor window is standardised with its own mean and std in __getitem__ ((w - w.mean(0)) / "
      "w.std(0)): the overheating label is the temperature level, which this removes from every window; what is "
      "left (the shape of the fluctuations) says nothing about the label (standardise with the training set's "
      "statistics)",
      r"per.?(window|sample|row|instance|example|input)[^.]*(standardi[sz]|normali[sz]|scal)|(its|their) own (mean|std|statistics|stats)|(window|sample|row|instance)s?[^.]*(standardi[sz]|normali[sz])\w* (with|by|using) (its|their|own)|(standardi[sz]|normali[sz]|scal)\w*[^.]*(each|every|per|its own|own) (window|sample|row|instance|example|input)|(mean|level|offset|scale)s? (is |are )?(removed|erased|lost)|(every|each|all) (window|sample|row|input)s?[^.]*(mean (of )?(0|zero)|unit (std|variance)|zero mean)|(inputs?|features?)[^.]*(zero mean and unit|mean 0 and std 1)")
def room_sensor_windows_standardised_per_window():
    seed(0)
    w, y = room_windows(s=46)
    model = nn.Sequential(nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(RoomWindows(w[:2560], y[:2560]), 64),
                val_loader=loader(RoomWindows(w[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 7: rows with NaN dropped from X only


def air_quality_table(n=3000, s=0):
    rng = np.random.default_rng(s)
    X = rng.normal(size=(n, 10)).astype(np.float32)
    w = rng.normal(size=10).astype(np.float32)
    y = (X @ w > 0).astype(np.int64)
    holes = rng.random(n) < 0.04
    X[holes, rng.integers(0, 10, int(holes.sum()))] = np.nan
    return X, y


@case("air_quality_nan_rows_dropped_from_features_only", "data",
      "rows with a missing sensor value are removed with X = X[~np.isnan(X).any(axis=1)] and the labels are then "
      "cut to the same length with y = y[:len(X)]: after the first dropped row every label belongs to an earlier "
      "station-hour (shifted by the number of rows dropped so far), so almost all inputs carry another row's label "
      "(filter y with the same mask)",
      r"misalign|(labels?|targets?)[^.]*(shift|offset|belong to (other|different|another|earlier)|not (match|aligned|correspond)|out of (sync|step))|(dropp|filter|remov)\w*[^.]*(rows?|nan)[^.]*(features?|inputs?|only|not (from )?(the )?(labels?|targets?))|(unrelated|independent)[^.]*(labels?|targets?|inputs?)|(labels?|targets?)[^.]*(unrelated|independent|random|shuffled)")
def air_quality_nan_rows_dropped_from_features_only():
    seed(0)
    X, y = air_quality_table(s=47)
    X = X[~np.isnan(X).any(axis=1)]
    y = y[:len(X)]
    x, y = torch.from_numpy(X), torch.from_numpy(y)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)
