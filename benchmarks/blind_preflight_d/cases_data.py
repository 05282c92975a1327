"""Set d: data by content (splits, samplers, items, augmentation, normalisation, collate)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset

from benchmarks.blind_preflight_d.registry import case, loader, seed, teacher_classes

OVERLAP = (r"overlap|leak|duplicat|identical|same (rows|samples|examples|images|inputs)|(appear|also|present|occur)\w* "
           r"in (both|the training|train)|validation[^.]*training (samples|rows|data)")
IDENTICAL = (r"identical|same (sample|input|row|example|batch|item|features?)|duplicat|constant|distinct|no variation"
             r"|(does not|doesn't) (vary|change)|imput")
MISALIGN = (r"misalign|align|sort|collate|shuffl|permut|(labels?|targets?)[^.]*(independent|unrelated|random"
            r"|uncorrelated|not (related|aligned|predictable)|do(es)? not (match|belong))|no (signal|relation)|chance")
AUGMENT = r"augment|flip|transform|mirror|channel (order|shuffl|permut)|colou?r"


class TabularMLP(nn.Module):
    def __init__(self, d, classes, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


@case("two_randperm_calls_overlapping_split", "data",
      bug="the train and validation indices come from two separate torch.randperm(N) calls ([:80%] of one, [80%:] of "
          "the other), so about 80% of the validation rows are also training rows",
      cause_pattern=OVERLAP)
def two_randperm_calls_overlapping_split():
    seed(40)
    x, y = teacher_classes(2500, 16, 3, s=40)
    full = TensorDataset(x, y)
    cut = int(0.8 * len(full))
    train_idx = torch.randperm(len(full))[:cut].tolist()
    val_idx = torch.randperm(len(full))[cut:].tolist()      # a second, different permutation
    model = TabularMLP(16, 3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(Subset(full, train_idx), 64),
                val_loader=loader(Subset(full, val_idx), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


@case("distributed_sampler_hardcoded_8_replicas", "data",
      bug="the single-process script kept DistributedSampler(ds, num_replicas=8, rank=0) from the 8-GPU launcher and "
          "never calls set_epoch, so every epoch trains on the same eighth of the dataset",
      cause_pattern=r"DistributedSampler|num_replicas|replica|\brank|shard|sampler|subset|distinct|few (samples|indices)"
                    r"|only \d+ (of|out of)|(1/8|eighth|12(\.5)? ?%)")
def distributed_sampler_hardcoded_8_replicas():
    seed(41)
    x, y = teacher_classes(4096, 16, 4, s=41)
    ds = TensorDataset(x, y)
    sampler = DistributedSampler(ds, num_replicas=8, rank=0, shuffle=True, seed=0)
    model = TabularMLP(16, 4)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=DataLoader(ds, batch_size=64, sampler=sampler), loss_fn=nn.CrossEntropyLoss())


@case("tabular_nan_imputation_any_replaces_all", "data",
      bug="the mean imputation is np.where(np.isnan(X).any(), col_means, X): .any() collapses the mask to one True, "
          "so every row of the table is replaced by the column means and all inputs are identical",
      cause_pattern=IDENTICAL)
def tabular_nan_imputation_any_replaces_all():
    seed(42)
    x, y = teacher_classes(3000, 12, 3, s=42)
    X = x.numpy().copy()
    rng = np.random.default_rng(42)
    X[rng.random(X.shape) < 0.03] = np.nan                   # a few missing cells
    col_means = np.nanmean(X, axis=0)
    X = np.where(np.isnan(X).any(), col_means, X)            # meant np.isnan(X)
    X = torch.tensor(X, dtype=torch.float32)
    model = TabularMLP(12, 3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(X, y), 64), loss_fn=nn.CrossEntropyLoss())


class ArrowSigns(Dataset):
    """1x16x16 arrows: label 0 points left, 1 points right; random horizontal flip as augmentation."""

    def __init__(self, n=1500, s=43):
        g = torch.Generator().manual_seed(s)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        self.images = torch.randn(n, 1, 16, 16, generator=g) * 0.2
        for i in range(n):
            row = 4 + int(torch.randint(0, 8, (1,), generator=g))
            self.images[i, 0, row, 3:13] += 1.0              # the shaft
            tip = 3 if self.labels[i] == 0 else 12           # the head on the left or the right end
            self.images[i, 0, row - 2:row + 3, tip] += 1.0
        self.rng = torch.Generator().manual_seed(s + 1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = self.images[i]
        if torch.rand(1, generator=self.rng) < 0.5:          # "standard" augmentation
            img = torch.flip(img, dims=[-1])
        return img, self.labels[i]


class SignCNN(nn.Module):
    def __init__(self, ch=1, classes=2):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(ch, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.head = nn.Linear(128, classes)

    def forward(self, x):
        return self.head(self.f(x))


@case("arrow_direction_random_hflip", "data",
      bug="the left/right arrow classifier is trained with a random horizontal flip, which turns a left arrow into a "
          "right arrow without changing its label: half the labels are wrong and direction cannot be learned",
      cause_pattern=AUGMENT)
def arrow_direction_random_hflip():
    seed(43)
    model = SignCNN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(ArrowSigns(), 32), loss_fn=nn.CrossEntropyLoss())


class StatusLEDs(Dataset):
    """3x12x12 crops of a panel: a lit status LED whose colour (red, green, blue) is the label; channel shuffle
    augmentation."""

    def __init__(self, n=1500, s=44):
        g = torch.Generator().manual_seed(s)
        self.labels = torch.randint(0, 3, (n,), generator=g)
        colours = torch.tensor([[1.0, 0.15, 0.15], [0.15, 1.0, 0.15], [0.15, 0.15, 1.0]])
        self.images = torch.randn(n, 3, 12, 12, generator=g) * 0.1
        for i in range(n):
            r, c = (int(v) for v in torch.randint(2, 8, (2,), generator=g))
            self.images[i, :, r:r + 3, c:c + 3] += colours[self.labels[i]].view(3, 1, 1)
        self.rng = torch.Generator().manual_seed(s + 1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        perm = torch.randperm(3, generator=self.rng)         # "colour robustness": shuffle the RGB channels
        return self.images[i][perm], self.labels[i]


@case("status_led_channel_shuffle_augment", "data",
      bug="the status-LED colour classifier augments by randomly permuting the RGB channels, which changes the "
          "LED's colour (what the label is) without changing the label: red, green and blue become indistinguishable",
      cause_pattern=AUGMENT)
def status_led_channel_shuffle_augment():
    seed(44)
    model = SignCNN(ch=3, classes=3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(StatusLEDs(), 32), loss_fn=nn.CrossEntropyLoss())


class ScanImages(Dataset):
    """uint8 grey scans; the transform scales them with floor division."""

    def __init__(self, n=1500, s=45):
        g = torch.Generator().manual_seed(s)
        self.labels = torch.randint(0, 4, (n,), generator=g)
        base = torch.randint(40, 120, (n, 1, 16, 16), generator=g)
        for i in range(n):
            r, c = divmod(int(self.labels[i]), 2)
            base[i, 0, r * 8 + 2:r * 8 + 6, c * 8 + 2:c * 8 + 6] += 100       # brighter quadrant (max 219)
        self.images = base.to(torch.uint8)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = (self.images[i] // 255).float()                  # meant self.images[i].float() / 255
        return x, self.labels[i]


@case("uint8_images_floor_divided_by_255", "data",
      bug="the uint8 scans are scaled with integer floor division (img // 255) before .float(); every pixel is below "
          "255, so every input image is all zeros",
      cause_pattern=r"(all|mostly|almost|entirely)[ -]?(zeros?|blank)|zeros?\b[^.]*(input|image|pixel|batch)"
                    r"|(input|image|pixel|batch)s?[^.]*(zero|blank|constant|identical)|integer|floor|uint8|//")
def uint8_images_floor_divided_by_255():
    seed(45)
    model = SignCNN(ch=1, classes=4)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(ScanImages(), 32), loss_fn=nn.CrossEntropyLoss())


@case("sensor_standardise_zero_std_column", "data",
      bug="the features are standardised as (X - mean) / std without an epsilon, and one sensor column is constant "
          "(a dead sensor that always reads 0, std 0), so that column is NaN in every row and the loss is NaN from the first step",
      cause_pattern=r"(input|feature|batch|column)s?[^.]*(nan|non.?finite|\binf)|(nan|non.?finite)[^.]*(input|feature"
                    r"|batch|column)|\bstd\b|standard deviation|zero (variance|std)|constant (column|feature|sensor)")
def sensor_standardise_zero_std_column():
    seed(46)
    x, y = teacher_classes(3000, 10, 3, s=46)
    raw = torch.cat([x * 3 + 20, torch.full((3000, 1), 0.0)], dim=1)   # column 10: a dead sensor, reads 0
    mean, std = raw.mean(0), raw.std(0)
    X = (raw - mean) / std
    model = TabularMLP(11, 3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(X, y), 64), loss_fn=nn.CrossEntropyLoss())


class Utterances(Dataset):
    def __init__(self, n=1500, s=47):
        g = torch.Generator().manual_seed(s)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(4, 30, (1,), generator=g))
            label = int(torch.randint(0, 3, (1,), generator=g))
            ids = torch.randint(5, 100, (length,), generator=g)
            ids[torch.randint(0, length, (2,), generator=g)] = label + 1     # intent keyword tokens 1..3
            self.items.append((ids, label))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def sorted_pack_collate(batch):
    seqs = [b[0] for b in batch]
    labels = torch.tensor([b[1] for b in batch])
    seqs = sorted(seqs, key=len, reverse=True)               # pack_padded_sequence wants them sorted...
    lengths = torch.tensor([len(s) for s in seqs])
    return pad_sequence(seqs, batch_first=True), lengths, labels   # ...but the labels keep the old order


class PackedIntentGRU(nn.Module):
    def __init__(self, vocab=100, d=32, classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, padding_idx=0)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.head = nn.Linear(d, classes)

    def forward(self, ids, lengths):
        packed = pack_padded_sequence(self.embed(ids), lengths, batch_first=True, enforce_sorted=True)
        _, h = self.gru(packed)
        return self.head(h[-1])


@case("packed_gru_collate_sorts_inputs_not_labels", "data",
      bug="the collate sorts the sequences by length for pack_padded_sequence(enforce_sorted=True) but builds the "
          "label tensor in the original order, so within each batch the labels no longer belong to their utterances",
      cause_pattern=MISALIGN)
def packed_gru_collate_sorts_inputs_not_labels():
    seed(47)

    def intent_loss(model, batch):
        ids, lengths, labels = batch
        return nn.functional.cross_entropy(model(ids, lengths), labels)

    model = PackedIntentGRU()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(Utterances(), 32, collate_fn=sorted_pack_collate), loss_fn=intent_loss)
