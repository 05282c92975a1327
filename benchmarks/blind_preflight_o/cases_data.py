"""Set o, family data: what reaches the model is not what the task or the deployment gives it."""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from benchmarks.blind_preflight_o.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed, tensors

# --------------------------------------------------------------------------------------------------------------
# Support-ticket router: the word index is rebuilt on the validation texts (fit_on_texts called again).
# Source: https://github.com/vitoriameneses/PLN_2025_vitoria_nicolas_felipe (fit the tokenizer once, on the training
# texts, and reuse its word index for validation and test)


def tickets(n: int, s: int, length: int = 16) -> tuple[list[list[str]], torch.Tensor]:
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    common = torch.randint(0, 200, (n, length), generator=g)
    topic = y.unsqueeze(1) * 12 + torch.randint(0, 12, (n, 4), generator=g)
    texts = [[f"topic{t}" for t in topic[i].tolist()] + [f"word{w}" for w in common[i, 4:].tolist()] for i in range(n)]
    for i, words in enumerate(texts):                                   # words in a shuffled order per ticket
        order = torch.randperm(length, generator=g).tolist()
        texts[i] = [words[k] for k in order]
    return texts, y


def fit_word_index(texts: list[list[str]]) -> dict[str, int]:
    """Ids in order of first appearance; 0 is kept for unknown words."""
    index: dict[str, int] = {}
    for words in texts:
        for w in words:
            index.setdefault(w, len(index) + 1)
    return index


def encode(texts: list[list[str]], index: dict[str, int]) -> torch.Tensor:
    return torch.tensor([[index.get(w, 0) for w in words] for words in texts])


class TicketRouter(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, 32, mode="mean")
        self.out = nn.Linear(32, 4)

    def forward(self, ids):
        return self.out(self.bag(ids))


@case("data_val_word_index_refit", "data",
      "The validation tickets are encoded with a word index fitted again on the validation texts (ids in order of "
      "first appearance) instead of the training index: the same word gets a different id in validation, so the "
      "embeddings learned for 'topic3' are looked up for unrelated words and validation accuracy sits at chance.",
      r"(vocab\w*|word[_ ]index|tokeni[sz]er|word[- ]to[- ]id|mapping)\W.{0,60}(validation|val|test)|(fit|built?|"
      r"rebuil\w*|refit\w*)\w* (again |separately )?on the (validation|val|test)|fit_on_texts|different (ids?|"
      r"indices|mapping)|same (vocab\w*|word index|tokenizer|mapping)|inconsistent (ids|mapping|encoding)")
def build_tickets(fixed: bool = False) -> dict:
    seed(0)
    texts, y = tickets(2400, 27)
    train_index = fit_word_index(texts[:2000])
    val_index = train_index if fixed else fit_word_index(texts[2000:])
    x, xv = encode(texts[:2000], train_index), encode(texts[2000:], val_index)
    model = TicketRouter(max(len(train_index), len(val_index)) + 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tensors(x, y[:2000]), 32),
                val_loader=loader(tensors(xv, y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("data_val_word_index_refit", fixed_of(build_tickets), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# Road-sign arrows (left / right / up / down) trained with a random horizontal flip that keeps the label.
# Source: https://crucialexams.com/study/questions/dy0-001/a-data-science-team-is-developing-a-computer-vision-model-to-classify/36604


def arrow_images(n: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 1, 12, 12): a right-pointing arrow rotated to right/up/left/down (labels 0-3), shifted, with noise."""
    g = gen(s)
    base = torch.zeros(7, 7)
    base[3, 0:6] = 1
    for k in range(1, 4):
        base[3 - k, 6 - k] = base[3 + k, 6 - k] = 1
    y = torch.randint(0, 4, (n,), generator=g)
    imgs = 0.3 * torch.randn(n, 1, 12, 12, generator=g)
    dy, dx = torch.randint(0, 6, (2, n), generator=g).tolist()
    for i in range(n):
        imgs[i, 0, dy[i]:dy[i] + 7, dx[i]:dx[i] + 7] += torch.rot90(base, int(y[i]))
    return imgs, y


class SignDataset(Dataset):
    def __init__(self, imgs, y, augment: bool, flip: bool):
        self.imgs, self.y, self.augment, self.flip = imgs, y, augment, flip

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        img = self.imgs[i]
        if self.augment:
            if self.flip and torch.rand(()) < 0.5:
                img = torch.flip(img, dims=[-1])                            # RandomHorizontalFlip(p=0.5)
            img = img + 0.1 * torch.randn(img.shape)                         # sensor noise
        return img, self.y[i]


class SignNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten(),
                                 nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


@case("data_hflip_on_direction_signs", "data",
      "The training Dataset applies a random horizontal flip (torch.flip(img, dims=[-1]) with p=0.5) to direction "
      "signs and keeps the label: a flipped 'left' arrow is a 'right' arrow still labelled 'left', so half the "
      "left/right training images carry the opposite label and the model cannot tell left from right.",
      r"flip\w*|mirror\w*|augment\w* (changes|alters|swaps|inverts) the (label|class)|left[ /-](and |or |vs\.? )?right"
      r"|label[- ]preserving|not (label[- ])?invariant")
def build_signs(fixed: bool = False) -> dict:
    seed(0)
    x, y = arrow_images(1500, 28)
    model = SignNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(SignDataset(x[:1200], y[:1200], augment=True, flip=not fixed), 32),
                val_loader=loader(SignDataset(x[1200:], y[1200:], augment=False, flip=False), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("data_hflip_on_direction_signs", fixed_of(build_signs), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")


# --------------------------------------------------------------------------------------------------------------
# Hourly demand model whose "smoothed demand" feature is a centred rolling mean (it contains the target hour).
# Source: https://temporalcv.readthedocs.io/en/latest/auto_examples/16_failure_rolling_stats.html


def demand(n: int = 3000, s: int = 29) -> torch.Tensor:
    g = gen(s)
    t = torch.arange(n, dtype=torch.float32)
    noise = torch.zeros(n)
    eps = 0.4 * torch.randn(n, generator=g)
    for k in range(1, n):
        noise[k] = 0.8 * noise[k - 1] + eps[k]
    return 2 + torch.sin(2 * torch.pi * t / 24) + 0.5 * torch.sin(2 * torch.pi * t / 168) + noise


def rolling_mean(series: torch.Tensor, centred: bool, window: int = 5) -> torch.Tensor:
    """pandas' series.rolling(5, center=True).mean() vs series.shift(1).rolling(5).mean(), NaN-free inside."""
    kernel = torch.ones(1, 1, window) / window
    full = F.conv1d(series.view(1, 1, -1), kernel).view(-1)                # full[k] = mean(series[k:k+window])
    out = torch.full_like(series, float("nan"))
    if centred:
        out[window // 2:len(series) - window // 2] = full
    else:
        out[window:] = full[:-1]
    return out


def demand_features(series: torch.Tensor, smooth: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, ...]:
    t = torch.arange(lo, hi)
    hour = 2 * torch.pi * (t % 24).float() / 24
    x = torch.stack([series[t - 1], series[t - 2], series[t - 24], hour.sin(), hour.cos(), smooth[t]], 1)
    return x, series[t]


def live_val(kw):
    series = demand()
    return [demand_features(series, rolling_mean(series, centred=False), 2500, 2990)]


@case("data_centred_rolling_feature_leaks_target", "data",
      "The 'smoothed demand' feature is a centred rolling mean (rolling(5, center=True)) over the archived series: "
      "the window around hour t contains the demand at t, t+1 and t+2, so the model learns to read the target out "
      "of the feature; at serving time only past hours exist, the feature becomes a trailing mean and the forecasts "
      "fall apart.",
      r"center ?= ?True|centr?(ed|ered) (rolling|window|moving)|future (values?|hours?|data|information)|look-?ahead"
      r"|(target|future) leak\w*|leak\w* (of )?(the )?(target|future)|shift\(1\)|trailing|(contains?|includes?) the "
      r"target")
def build_demand(fixed: bool = False) -> dict:
    seed(0)
    series = demand()
    smooth = rolling_mean(series, centred=not fixed)
    x, y = demand_features(series, smooth, 30, 2500)
    xv, yv = demand_features(series, smooth, 2500, 2990)
    model = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tensors(x, y), 64),
                val_loader=loader(tensors(xv, yv), 245, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("data_centred_rolling_feature_leaks_target", fixed_of(build_demand),
    rmse_of(lambda m, b: (m(b[0]), b[1]), live_val), "live-feature RMSE", higher=False)


# --------------------------------------------------------------------------------------------------------------
# House-price MLP: the validation listings (a newer development) are standardised with their own mean and std.
# Source: https://lschmiddey.github.io/fastpages_/2021/10/25/How-to-correctly-standardize-your-data.html


def listings(n: int, s: int, newer: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(s)
    sqft = (2100 if newer else 1500) + 350 * torch.randn(n, generator=g)
    rooms = (sqft / 450 + torch.randn(n, generator=g)).round().clamp(1, 8)
    age = (5 if newer else 30) + 8 * torch.rand(n, generator=g) * (1 if newer else 3)
    dist = 2 + 10 * torch.rand(n, generator=g)
    price = 0.15 * sqft + 12 * rooms - 0.8 * age - 6 * dist + 15 * torch.randn(n, generator=g)
    return torch.stack([sqft, rooms, age, dist], 1), price


class Standardizer:
    def fit(self, x):
        self.mean, self.std = x.mean(0), x.std(0)
        return self

    def transform(self, x):
        return (x - self.mean) / self.std


@case("data_val_scaler_refit_on_val", "data",
      "The validation listings come from a newer development (larger, newer houses) and are standardised with a "
      "scaler fitted again on the validation set (fit_transform on val) instead of the training mean and std: the "
      "shift in square footage and age is erased, a large new house looks like an average old one and its price "
      "is badly underestimated.",
      r"fit_transform|(scaler|standardi[sz]\w*|normali[sz]\w*|mean and std|statistics)\W.{0,60}(fit|fitted|computed|"
      r"refit)\w* (again |separately )?on the (validation|val|test)|training (mean|statistics|scaler)|transform\(\) "
      r"only|own (mean|statistics)")
def build_listings(fixed: bool = False) -> dict:
    seed(0)
    x, price = listings(1600, 30, newer=False)
    xv, price_v = listings(300, 31, newer=True)
    scaler = Standardizer().fit(x)
    val_scaler = scaler if fixed else Standardizer().fit(xv)
    target = Standardizer().fit(price.unsqueeze(1))
    y, yv = target.transform(price.unsqueeze(1)).squeeze(1), target.transform(price_v.unsqueeze(1)).squeeze(1)
    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tensors(scaler.transform(x), y), 32),
                val_loader=loader(tensors(val_scaler.transform(xv), yv), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("data_val_scaler_refit_on_val", fixed_of(build_listings), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE (train-scaled price)", higher=False)


# --------------------------------------------------------------------------------------------------------------
# Sound-event clips and their label files paired by two directory listings, only one of them sorted.
# Sources: https://github.com/keras-team/keras/pull/3871, https://github.com/chuanyangjin/fast-DiT/issues/4


def listdir(names: list[str]) -> list[str]:
    """What os.listdir gave on the cluster: directory (hash) order, reproduced deterministically."""
    return sorted(names, key=lambda name: hashlib.md5(name.encode()).hexdigest())


def sound_archive(n: int, s: int, prefix: str) -> tuple[dict, dict]:
    g = gen(s)
    templates = torch.randn(8, 40, generator=gen(32))
    y = torch.randint(0, 8, (n,), generator=g)
    feats = templates[y] + 0.8 * torch.randn(n, 40, generator=g)
    names = [f"{prefix}_{k:04d}" for k in range(n)]
    clips = {f"{nm}.wav": feats[k] for k, nm in enumerate(names)}
    labels = {f"{nm}.txt": int(y[k]) for k, nm in enumerate(names)}
    return clips, labels


def pair_up(clips: dict, labels: dict, fixed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    wav_files = sorted(listdir(list(clips))) if fixed else listdir(list(clips))
    label_files = sorted(listdir(list(labels)))
    return torch.stack([clips[f] for f in wav_files]), torch.tensor([labels[f] for f in label_files])


@case("data_listdir_pairs_clips_with_wrong_labels", "data",
      "The clips are read in os.listdir order while the label files are read from sorted(os.listdir(...)): "
      "listdir returns entries in arbitrary directory order, so zipping the two lists pairs each clip with another "
      "clip's label file and the sound-event labels are effectively shuffled against the audio.",
      r"listdir|sorted\(|directory order|(file|filename)s? order|arbitrary order|not sorted|unsorted|sort (the|both)"
      r"|pair\w* (each )?\w+ with (the wrong|another|a different)|mismatch\w* between (the )?(clips|files|features|"
      r"inputs) and (their )?labels")
def build_sounds(fixed: bool = False) -> dict:
    seed(0)
    x, y = pair_up(*sound_archive(1600, 33, "train"), fixed)
    xv, yv = pair_up(*sound_archive(400, 34, "val"), fixed)
    model = nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 8))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tensors(x, y), 32),
                val_loader=loader(tensors(xv, yv), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("data_listdir_pairs_clips_with_wrong_labels", fixed_of(build_sounds),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")
