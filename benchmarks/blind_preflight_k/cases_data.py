"""Family ``data``: loaders, samplers, collate functions, normalisation statistics, label/input pairing."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset, TensorDataset, WeightedRandomSampler

from benchmarks.blind_preflight_k.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    seed,
    split,
    teacher_classes,
)

_argmax = acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))


# --- 1. features and labels shuffled with two different permutations --------------------------------------------------
def heart_shuffled_separately(fixed: bool = False):
    seed(0)
    x, y = teacher_classes(1500, 14, 2, s=311)
    X, Y = x.numpy().copy(), y.numpy().copy()
    X_train, y_train = X[:1200], Y[:1200]
    if fixed:
        perm = np.random.permutation(len(X_train))
        X_train, y_train = X_train[perm], y_train[perm]
    else:
        np.random.shuffle(X_train)                                # "shuffle before the split into batches"
        np.random.shuffle(y_train)
    model = nn.Sequential(nn.Linear(14, 32), nn.ReLU(), nn.Linear(32, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(torch.from_numpy(X_train), torch.from_numpy(y_train)),
                                    batch_size=50),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("heart_shuffled_separately", "data",
     "The training features and labels are shuffled with two separate np.random.shuffle calls, i.e. two different "
     "permutations, so every row is paired with another patient's label; shuffle both with one permutation "
     "(X[perm], y[perm]).",
     r"shuffl\w* (separately|independently|twice)|(two|separate|independent|different) (shuffl\w*|permutations?)|"
     r"same permutation|one permutation|(X|features|inputs) and (y|labels|targets) (are |were )?shuffled|"
     r"(rows|samples|inputs) (are )?paired with (the )?(wrong|other|another)",
     )(heart_shuffled_separately)
fix("heart_shuffled_separately", fixed_of(heart_shuffled_separately), _argmax, "val accuracy", steps=250)


# --- 2. collate sorts the sequences by length but not the labels --------------------------------------------------------
class SessionGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(21, 16, padding_idx=0)
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, padded, lengths):
        packed = pack_padded_sequence(self.emb(padded), lengths.cpu(), batch_first=True, enforce_sorted=True)
        _, h = self.gru(packed)
        return self.head(h[-1])


def _sessions(n, s):
    g = gen(s)
    seqs, labels = [], []
    for _ in range(n):
        length = int(torch.randint(4, 21, (1,), generator=g))
        seq = torch.randint(1, 21, (length,), generator=g)
        seqs.append(seq)
        labels.append(int((seq <= 10).sum() * 2 > length))
    return seqs, torch.tensor(labels)


class Sessions(Dataset):
    def __init__(self, seqs, labels):
        self.seqs, self.labels = seqs, labels

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return self.seqs[i], self.labels[i]


def make_collate(reorder_labels: bool):
    def collate(batch):
        seqs, labels = zip(*batch)
        lengths = torch.tensor([len(s) for s in seqs])
        lengths, order = lengths.sort(descending=True)            # pack_padded_sequence wants them sorted
        padded = pad_sequence([seqs[i] for i in order], batch_first=True)
        labels = torch.stack(labels)
        return padded, lengths, (labels[order] if reorder_labels else labels)
    return collate


def _gru_loss(model, batch):
    padded, lengths, y = batch
    return F.cross_entropy(model(padded, lengths), y)


def session_collate_unsorted_labels(fixed: bool = False):
    seed(0)
    seqs, labels = _sessions(1500, 321)
    train, val = Sessions(seqs[:1200], labels[:1200]), Sessions(seqs[1200:], labels[1200:])
    model = SessionGRU()
    collate = make_collate(reorder_labels=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(train, batch_size=40, collate_fn=collate),
                val_loader=loader(val, batch_size=100, shuffle=False, collate_fn=collate),
                loss_fn=_gru_loss, max_steps=300)


def _session_acc(model, kw):
    val = DataLoader(kw["val_loader"].dataset, batch_size=100, collate_fn=make_collate(True))
    return mean_over(model, val, lambda m, b: ((m(b[0], b[1]).argmax(-1) == b[2]).sum().item(), len(b[2])))


case("session_collate_unsorted_labels", "data",
     "The collate_fn sorts each batch's sequences by length (for pack_padded_sequence) but returns the labels in the "
     "original order, so within every batch the sequences and labels are mismatched; index the labels with the same "
     "sort order (labels[order]).",
     r"collate\w*|labels?\[order\]|(sort|reorder)\w*.{0,80}(labels?|targets?).{0,40}(not|never|without)|"
     r"(labels?|targets?) (are |were )?(not|never) (re-?ordered|re-?sorted|permuted|sorted)|same (sort )?order",
     )(session_collate_unsorted_labels)
fix("session_collate_unsorted_labels", fixed_of(session_collate_unsorted_labels), _session_acc, "val accuracy",
    steps=250)


# --- 3. standardisation statistics over the wrong axis ------------------------------------------------------------------
def _meters(s):
    g = gen(s)
    n = 1500
    level = torch.randn(n, 1, generator=g)
    z = torch.randn(n, 16, generator=g)
    w = torch.randn(16, generator=g) / 4
    y = (1.5 * level[:, 0] + z @ w > 0).long()
    units = torch.logspace(0, 2, 16)                               # kWh, Wh, ... columns in mixed units
    x = (level + z) * units + 5 * units
    return x.numpy(), y


def meter_standardised_per_row(fixed: bool = False):
    seed(0)
    X, y = _meters(331)
    X_train, X_val = X[:1200], X[1200:]
    if fixed:
        mu, sd = X_train.mean(axis=0), X_train.std(axis=0)
        X_train, X_val = (X_train - mu) / sd, (X_val - mu) / sd
    else:
        X_train = (X_train - X_train.mean(axis=1, keepdims=True)) / X_train.std(axis=1, keepdims=True)
        X_val = (X_val - X_val.mean(axis=1, keepdims=True)) / X_val.std(axis=1, keepdims=True)
    xt, xv = torch.from_numpy(X_train).float(), torch.from_numpy(X_val).float()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, y[:1200]), batch_size=50),
                val_loader=loader(TensorDataset(xv, y[1200:]), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("meter_standardised_per_row", "data",
     "The features are standardised with mean/std over axis=1 (each sample across its features) instead of axis=0 "
     "(each feature across the training samples): every row is forced to mean 0 and std 1, which erases each "
     "meter's overall level, the main signal, while the columns keep their mixed units; use axis=0 statistics from "
     "the training set.",
     r"axis\s*=\s*[01]|dim\s*=\s*1.{0,40}(mean|std|normali[sz])|per[- ](row|sample)|(each|every) (row|sample)"
     r".{0,60}(mean|std|standardi[sz]|normali[sz])|(standardi[sz]|normali[sz])\w* (across|over) (the )?features|"
     r"(wrong|transposed) axis|row[- ]wise",
     )(meter_standardised_per_row)
fix("meter_standardised_per_row", fixed_of(meter_standardised_per_row), _argmax, "val accuracy", steps=250)


# --- 4. WeightedRandomSampler given one weight per class ---------------------------------------------------------------
def fault_sampler_class_weights(fixed: bool = False):
    seed(0)
    g = gen(341)
    x = torch.randn(4000, 12, generator=g)
    w = torch.randn(12, 4, generator=g)
    y = (x @ w + torch.tensor([1.5, 0.5, 0.0, -0.5])).argmax(1)
    xt, yt, xv, yv = x[:1600], y[:1600], x[1600:2000], y[1600:2000]
    class_weights = 1.0 / torch.bincount(yt, minlength=4).double()
    weights = class_weights[yt] if fixed else class_weights         # "balance the classes"
    sampler = WeightedRandomSampler(weights, num_samples=len(yt), replacement=True,
                                    generator=torch.Generator().manual_seed(1234))
    model = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Linear(48, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=DataLoader(TensorDataset(xt, yt), batch_size=50, sampler=sampler),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("fault_sampler_class_weights", "data",
     "WeightedRandomSampler is given the 4 per-class weights instead of one weight per training sample, so it "
     "only ever draws dataset indices 0-3: every batch repeats the same four rows; pass class_weights[labels].",
     r"WeightedRandomSampler|(one|a) weight per (training )?(sample|example|row)|per[- ]sample weights|"
     r"(only|just) (ever )?(draws?|samples?|yields?) (the )?(indices|rows|samples) 0|len\(weights\)|"
     r"weights (has|have|of) length|class_weights\[|(only|just) \d+ (distinct|unique|different) (samples|rows|"
     r"indices)",
     )(fault_sampler_class_weights)
fix("fault_sampler_class_weights", fixed_of(fault_sampler_class_weights), _argmax, "val accuracy", steps=250)


# --- 5. Dataset.__len__ returns the number of columns ------------------------------------------------------------------
class CSVDataset(Dataset):
    def __init__(self, X, y, fixed):
        self.X, self.y, self.fixed = X, y, fixed

    def __len__(self):
        return self.X.shape[0] if self.fixed else self.X.shape[1]

    def __getitem__(self, i):
        return self.X[i], self.y[i]


def crop_dataset_len_columns(fixed: bool = False):
    seed(0)
    x, y = teacher_classes(1500, 40, 4, s=351)
    (xt, yt), (xv, yv) = split(x, y, 1200)
    model = nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(CSVDataset(xt, yt, fixed), batch_size=32),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("crop_dataset_len_columns", "data",
     "The custom Dataset's __len__ returns self.X.shape[1] (the 40 feature columns) instead of shape[0] (1200 rows), "
     "so the loader only ever yields the first 40 samples and the model memorises them; return len(self.X).",
     r"__len__|len\(dataset\)|len\(self\.X\)|shape\[1\]|dataset (length|size) .{0,40}(40|columns|features)|"
     r"(only|just) (the first )?40 (samples|rows|examples)|number of (features|columns)|"
     r"(uses|sees|yields|covers) only .{0,30}(of the|samples|rows)",
     )(crop_dataset_len_columns)
fix("crop_dataset_len_columns", fixed_of(crop_dataset_len_columns), _argmax, "val accuracy", steps=250)
