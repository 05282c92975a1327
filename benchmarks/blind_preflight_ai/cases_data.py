"""Set ai, family data: what reaches the model is not what the user meant (rows standardised one by one, a split of a
class-sorted table without shuffling, image and mask flipped by separate coin tosses, sorted file names against
labels in CSV order, per-class weights given to WeightedRandomSampler)."""

from __future__ import annotations

import random

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset, WeightedRandomSampler

from benchmarks.blind_preflight_ai.cases_shapes import blob_masks, seg_fwd, seg_net
from benchmarks.blind_preflight_ai.cases_trained import nonlinear_classes
from benchmarks.blind_preflight_ai.registry import (
    acc_of,
    case,
    class_mean_acc,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_of,
    seed,
)

# ---------------------------------------------------------------------------------------------------------------
# ai_per_row_standardize: energy-meter regression, each row z-scored on its own


def meter_rows(n: int, s: int):
    """12 hourly readings of a building; the target (next-day peak) depends on the building's overall level and the
    evening/morning ratio."""
    g = gen(s)
    level = torch.rand(n, 1, generator=g) * 4 + 1
    shape = 1 + 0.3 * torch.randn(n, 12, generator=g)
    x = level * shape
    y = 0.8 * level.squeeze(1) + 0.3 * (x[:, 8:].mean(1) / x[:, :4].mean(1))
    x_mean, x_std = x[: int(0.8 * n)].mean(0), x[: int(0.8 * n)].std(0)
    y = (y - y[: int(0.8 * n)].mean()) / y[: int(0.8 * n)].std()
    return x, y, x_mean, x_std


class MeterRows(Dataset):
    def __init__(self, x, y, mean, std, fixed):
        self.x, self.y, self.mean, self.std, self.fixed = x, y, mean, std, fixed

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        row = self.x[i]
        if self.fixed:
            row = (row - self.mean) / self.std                 # per feature, training-set statistics
        else:
            row = (row - row.mean()) / row.std()               # BUG: each row against itself
        return row, self.y[i]


@case("ai_per_row_standardize", "data",
      bug="The Dataset standardises each row against its own mean and std ((row - row.mean()) / row.std()) instead "
          "of each feature with training-set statistics: every building's 12 readings come out with mean 0 and "
          "std 1, so its overall consumption level, which drives the target, is erased from the inputs.",
      cause_pattern=r"(per|each|every)[- ](row|sample|example|instance).{0,60}(normali[sz]|standardi[sz]|z-?scor|"
                    r"mean|std)|(normali[sz]|standardi[sz]|z-?scor)\w*.{0,60}(per|each|every|own|its) (row|sample|"
                    r"example)|row\.mean\(\)|(own|its) (mean|statistics)|(axis|dim)=1.{0,40}(mean|std|normali)|"
                    r"per[- ]feature (statistics|normali[sz]|standardi[sz]|mean)|normali[sz]e per[- ]feature")
def per_row_standardize(fixed: bool = False):
    seed(0)
    x, y, mean, std = meter_rows(1500, 41)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(MeterRows(x[:1200], y[:1200], mean, std, fixed), 32),
                val_loader=loader(MeterRows(x[1200:], y[1200:], mean, std, fixed), 300, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=800)


fix("ai_per_row_standardize", fixed_of(per_row_standardize), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE (same pipeline)", steps=250, higher=False)

# ---------------------------------------------------------------------------------------------------------------
# ai_class_sorted_split: a table exported sorted by label, split by position


@case("ai_class_sorted_split", "data",
      bug="The table comes sorted by label and is split by position (rows[:1200] train, rows[1200:] validation, "
          "train_test_split(shuffle=False) style): the training rows hold classes 0-2 only and the validation rows "
          "are mostly class 3, which the model never sees; shuffling inside the DataLoader does not help.",
      cause_pattern=r"(sorted|ordered) by (label|class|target)|(label|class|target)[- ](sorted|ordered)|"
                    r"shuffle=False|(split|partition)\w*.{0,60}(without|before|no) shuffl|stratif|"
                    r"(class|label)\w* (missing|absent|unseen|never seen|not present).{0,60}(train|split)|"
                    r"(train\w*|split).{0,60}(missing|lacks?|no|never sees?) (class|label)")
def class_sorted_split(fixed: bool = False):
    seed(0)
    x, y = nonlinear_classes(1600, 42)
    order = torch.argsort(y, stable=True)                   # the export is sorted by label
    x, y = x[order], y[order]
    if fixed:
        perm = torch.randperm(len(y), generator=gen(43))
        x, y = x[perm], y[perm]
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=800)


fix("ai_class_sorted_split", fixed_of(class_sorted_split), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=250)

# ---------------------------------------------------------------------------------------------------------------
# ai_unpaired_seg_flip: segmentation augmentation with separate coin tosses


class FlipSeg(Dataset):
    def __init__(self, x, m, fixed, augment=True):
        self.x, self.m, self.fixed, self.augment = x, m.long(), fixed, augment
        self.rng = random.Random(44)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        img, mask = self.x[i], self.m[i]
        if not self.augment:
            return img, mask
        if self.fixed:
            h, v = self.rng.random() < 0.5, self.rng.random() < 0.5
            if h:
                img, mask = img.flip(-1), mask.flip(-1)
            if v:
                img, mask = img.flip(-2), mask.flip(-2)
        else:                                           # BUG: each tensor gets its own random flips
            if self.rng.random() < 0.5:
                img = img.flip(-1)
            if self.rng.random() < 0.5:
                img = img.flip(-2)
            if self.rng.random() < 0.5:
                mask = mask.flip(-1)
            if self.rng.random() < 0.5:
                mask = mask.flip(-2)
        return img, mask


@case("ai_unpaired_seg_flip", "data",
      bug="The segmentation Dataset applies its random horizontal and vertical flips to the image and to the mask "
          "with separate random draws (as with two calls of a RandomHorizontalFlip / RandomVerticalFlip transform): "
          "image and mask end up flipped alike only a quarter of the time, so most target masks no longer cover "
          "their objects.",
      cause_pattern=r"(separate|independent|different|two) (random )?(draws?|coin|calls?|flips?|transforms?|"
                    r"random)|(image|input) and (the )?(mask|label|target).{0,80}(differently|not (the )?same|"
                    r"mis-?align|out of sync|independent)|mis-?align\w*.{0,40}(mask|label|target)|"
                    r"(same|shared|joint) (random )?(transform|flip|parameters|seed).{0,60}(image|mask)")
def unpaired_seg_flip(fixed: bool = False):
    seed(0)
    x, m = blob_masks(600, 45)
    model = seg_net()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(FlipSeg(x[:450], m[:450], fixed), 16),
                val_loader=loader(FlipSeg(x[450:], m[450:], fixed, augment=False), 50, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=800)


fix("ai_unpaired_seg_flip", fixed_of(unpaired_seg_flip),
    lambda model, kw: class_mean_acc(model, kw["val_loader"], seg_fwd, 3), "val class-mean pixel accuracy", steps=200)

# ---------------------------------------------------------------------------------------------------------------
# ai_sorted_names_csv_labels: image files listed and sorted by name, labels read from a CSV in id order


def scan_files(n: int, s: int):
    """A 'folder' of n small grey images scan_1.png ... scan_n.png, and labels.csv rows in id order."""
    x, y = nonlinear_classes(n, s, d=16, c=3)
    files = {f"scan_{i + 1}.png": x[i].reshape(1, 4, 4) for i in range(n)}
    csv_rows = [(f"scan_{i + 1}.png", int(y[i])) for i in range(n)]
    return files, csv_rows


class ScanFolder(Dataset):
    def __init__(self, files, csv_rows, fixed):
        self.files = files
        self.names = sorted(files)                         # scan_1, scan_10, scan_100, scan_1000, scan_1001 ...
        if fixed:
            by_name = dict(csv_rows)
            self.labels = [by_name[name] for name in self.names]
        else:
            self.labels = [label for _, label in csv_rows]  # BUG: CSV order, not the sorted file order
        self.names, self.labels = self.names, self.labels

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        return self.files[self.names[i]], self.labels[i]


class ScanNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 3))

    def forward(self, x):
        return self.net(x)


@case("ai_sorted_names_csv_labels", "data",
      bug="The Dataset lists the image files with sorted(os.listdir(...)) (lexicographic: scan_1, scan_10, "
          "scan_100, ...) but takes the labels from labels.csv in its own row order (scan_1, scan_2, scan_3, ...) "
          "and pairs them by position: almost every image gets another image's label.",
      cause_pattern=r"listdir|sorted\(|(lexicograph|alphabetic)\w*|(file|name)s?.{0,40}(order|sort)\w*.{0,60}"
                    r"(label|csv)|(label|csv)\w*.{0,60}(order|sort)\w*.{0,40}(file|name|image)|"
                    r"(pair|match)\w* (by|on) (position|index)|(look ?up|join|map)\w* (the )?labels? by (file ?)?name")
def sorted_names_csv_labels(fixed: bool = False):
    seed(0)
    files, rows = scan_files(1600, 46)
    train_files = {k: files[k] for k, _ in rows[:1200]}
    val_files = {k: files[k] for k, _ in rows[1200:]}
    model = ScanNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ScanFolder(train_files, rows[:1200], fixed), 32),
                val_loader=loader(ScanFolder(val_files, rows[1200:], True), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=800)


fix("ai_sorted_names_csv_labels", fixed_of(sorted_names_csv_labels),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy (labels matched by name)", steps=250)

# ---------------------------------------------------------------------------------------------------------------
# ai_sampler_class_weights: fraud-like imbalanced classification with WeightedRandomSampler


def imbalanced(n: int, s: int):
    g = gen(s)
    y = torch.multinomial(torch.tensor([0.75, 0.17, 0.08]), n, replacement=True, generator=g)
    centers = torch.randn(3, 10, generator=g) * 1.2
    x = centers[y] + torch.randn(n, 10, generator=g)
    return x, y


@case("ai_sampler_class_weights", "data",
      bug="To balance the classes, WeightedRandomSampler gets the three per-class weights (1 / class count) instead "
          "of one weight per sample: it draws indices from range(len(weights)) = 0, 1, 2, so every batch repeats the "
          "same three training rows and the model never sees the rest of the data.",
      cause_pattern=r"WeightedRandomSampler|(per|one weight per)[- ]class|(weight|weights) (per|for each) "
                    r"(sample|example|row)|len\(weights\)|(only|just) (the )?(first )?(3|three) (rows|samples|"
                    r"indices|examples)|indices 0, 1(,| and) 2|sample weights")
def sampler_class_weights(fixed: bool = False):
    seed(0)
    x, y = imbalanced(2000, 47)
    xt, yt = x[:1500], y[:1500]
    class_weights = 1.0 / torch.bincount(yt, minlength=3).double()
    weights = class_weights[yt] if fixed else class_weights          # BUG: 3 weights for 1500 rows
    sampler = WeightedRandomSampler(weights, num_samples=len(yt), replacement=True, generator=gen(48))
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=DataLoader(TensorDataset(xt, yt), batch_size=32, sampler=sampler),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 500, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=800)


fix("ai_sampler_class_weights", fixed_of(sampler_class_weights),
    lambda model, kw: class_mean_acc(model, kw["val_loader"], lambda m, b: (m(b[0]).argmax(-1), b[1]), 3),
    "val balanced accuracy", steps=250)
