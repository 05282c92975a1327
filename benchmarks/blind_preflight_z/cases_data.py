"""Data: preprocessing, ordering, augmentation and file-to-label lookups that silently break the examples."""

from __future__ import annotations

import random
import re

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_z.registry import case, fix, fixed_of, gen, loader, plain_acc, seed

# --------------------------------------------------------------------------------------------------------------
# 1. Loan default model on raw tabular columns (age, income, debt, ...): the training split is standardised with
#    its mean and std, the validation split is fed raw (the scaler was only applied to X_train).

RAW_MEAN = torch.tensor([42.0, 52000.0, 9000.0, 680.0, 3.0, 12.0])
RAW_STD = torch.tensor([12.0, 18000.0, 6000.0, 60.0, 1.5, 8.0])


def _loans(n, s=31):
    g = gen(s)
    z = torch.randn(n, 6, generator=g)
    y = ((z @ torch.tensor([-0.4, -1.0, 1.2, -0.9, 0.3, 0.5])) + 0.3 * torch.randn(n, generator=g) > 0).long()
    return z * RAW_STD + RAW_MEAN, y


@case("val_split_not_standardized", "data",
      "Only the training split is standardised with the training mean and std; the validation split is passed in "
      "raw units (incomes ~5e4, scores ~700), so the model is evaluated on inputs thousands of standard deviations "
      "off the scale it was trained on (apply the same scaler to the validation data).",
      r"(validation|val|test|eval)[a-z_ ]{0,20}.{0,60}(not |un)(normali[sz]ed|standardi[sz]ed|scaled)|"
      r"(same|training) (scaler|mean|statistics|normali[sz]ation).{0,60}(validation|val|test)|"
      r"(scaler|mean and std).{0,40}only.{0,30}train|(train|validation).{0,40}(different|mismatch).{0,40}(scale|"
      r"distribution|statistics)")
def val_split_not_standardized(fixed: bool = False):
    seed(0)
    x, y = _loans(2500)
    xt, xv = x[:2000], x[2000:]
    mean, std = xt.mean(0), xt.std(0)
    xt_s = (xt - mean) / std
    xv_s = (xv - mean) / std if fixed else xv
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt_s, y[:2000]), 32),
                val_loader=loader(TensorDataset(xv_s, y[2000:]), 500, shuffle=False), loss_fn=nn.CrossEntropyLoss())


fix("val_split_not_standardized", fixed_of(val_split_not_standardized), plain_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 2. Bird-song clips concatenated species by species (as read folder after folder) and loaded with
#    DataLoader(shuffle=False): every batch holds one class and the last few hundred steps see one species.


def _birds(n_per, c=5, s=32):
    g = gen(s)
    centers = torch.randn(c, 10, generator=gen(321)) * 0.5
    xs = [centers[k] + torch.randn(n_per, 10, generator=g) for k in range(c)]
    ys = [torch.full((n_per,), k) for k in range(c)]
    return torch.cat(xs), torch.cat(ys)


@case("class_sorted_without_shuffle", "data",
      "The training set is stored class by class (all species 0, then 1, ...) and the DataLoader has shuffle=False, "
      "so each batch contains a single class and the model drifts to whichever class it saw last (shuffle=True).",
      r"(sorted|ordered|grouped|stored) by (class|label)|class by class|(single|one) (class|label) (per|in each) batch|"
      r"batches? (contain|hold)s? (a single|one|only one) (class|label)|(label|class)[- ](ordered|sorted)|"
      r"same (class|label) in (each|every) batch")
def class_sorted_without_shuffle(fixed: bool = False):
    seed(0)
    x, y = _birds(600)
    xv, yv = _birds(100, s=33)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 5))
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(x, y), 32, shuffle=fixed),
                val_loader=loader(TensorDataset(xv, yv), 250, shuffle=False), loss_fn=nn.CrossEntropyLoss())


fix("class_sorted_without_shuffle", fixed_of(class_sorted_without_shuffle), plain_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 3. Delivery-delay classifier with a one-hot "city" column made by a get_dummies-style helper run separately
#    on each split. The validation split has no "Aachen" rows, so its dummy columns start one city later; the
#    shape error was "fixed" by padding the missing column at the end.

CITIES = ["Aachen", "Berlin", "Cologne", "Dresden", "Essen", "Frankfurt"]


def get_dummies(values):
    """What pd.get_dummies does for one column: one 0/1 column per distinct value, in sorted order."""
    cats = sorted(set(values))
    return np.array([[1.0 if v == c else 0.0 for c in cats] for v in values]), cats


def _deliveries(n, s, cities):
    rng = random.Random(s)
    city = [rng.choice(cities) for _ in range(n)]
    g = gen(s)
    dist = torch.rand(n, 1, generator=g) * 2
    effect = torch.tensor([2.0, -1.5, 0.5, -0.5, 1.5, -2.0])
    idx = torch.tensor([CITIES.index(c) for c in city])
    y = (effect[idx] + dist[:, 0] - 1 + 0.3 * torch.randn(n, generator=g) > 0).long()
    return city, dist, y


@case("dummies_encoded_per_split", "data",
      "The city column is one-hot encoded separately on each split with a get_dummies-style helper; the validation "
      "split lacks one city, so its dummy columns are shifted by one and the 'missing' column was padded at the end: "
      "validation rows arrive with the wrong city switched on (encode with the training categories).",
      r"get_dummies|one-?hot.{0,80}(separately|per split|each split|columns?|categor)|dummy (columns?|variables?)|"
      r"categor(y|ies|ical).{0,60}(mismatch|different|shift|align|order)|column (order|alignment|mismatch)")
def dummies_encoded_per_split(fixed: bool = False):
    seed(0)
    c_tr, d_tr, y_tr = _deliveries(2000, 34, CITIES)
    c_va, d_va, y_va = _deliveries(500, 35, CITIES[1:])
    oh_tr, cats = get_dummies(c_tr)
    if fixed:
        oh_va = np.array([[1.0 if v == c else 0.0 for c in cats] for v in c_va])
    else:
        oh_va, _ = get_dummies(c_va)
        oh_va = np.pad(oh_va, ((0, 0), (0, oh_tr.shape[1] - oh_va.shape[1])))  # "fix" for the shape error
    xt = torch.cat([torch.tensor(oh_tr, dtype=torch.float32), d_tr], 1)
    xv = torch.cat([torch.tensor(oh_va, dtype=torch.float32), d_va], 1)
    model = nn.Sequential(nn.Linear(7, 32), nn.ReLU(), nn.Linear(32, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, y_tr), 32),
                val_loader=loader(TensorDataset(xv, y_va), 250, shuffle=False), loss_fn=nn.CrossEntropyLoss())


fix("dummies_encoded_per_split", fixed_of(dummies_encoded_per_split), plain_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 4. Hand-gesture arrows (left / right / up / down) with a "standard" augmentation copied from an ImageNet
#    recipe: random horizontal flip of the image, label unchanged -- a flipped left arrow is a right arrow.


def _arrows(n, s):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    img = 0.25 * torch.randn(n, 1, 12, 12, generator=g)
    for i in range(n):
        o = torch.randint(2, 10, (1,), generator=g).item()
        shaft = torch.zeros(12, 12)
        if y[i] < 2:  # left / right: horizontal shaft with a head at one end
            shaft[o, 2:10] = 1.0
            end = 2 if y[i] == 0 else 9
            shaft[max(o - 1, 0):o + 2, end] = 1.0
        else:  # up / down
            shaft[2:10, o] = 1.0
            end = 2 if y[i] == 2 else 9
            shaft[end, max(o - 1, 0):o + 2] = 1.0
        img[i, 0] += shaft
    return img, y


class ArrowImages(Dataset):
    def __init__(self, img, y, augment, flip):
        self.img, self.y, self.augment, self.flip = img, y, augment, flip

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.img[i]
        if self.augment and self.flip and random.random() < 0.5:
            x = torch.flip(x, dims=[2])  # RandomHorizontalFlip
        if self.augment:
            x = x + 0.05 * torch.randn_like(x)
        return x, self.y[i]


@case("hflip_augment_direction_labels", "data",
      "The training transform applies a random horizontal flip to arrow images whose labels are left / right "
      "without swapping the label, so half of the left and right examples carry the opposite label and the model "
      "cannot tell them apart (drop the flip or swap the label with it).",
      r"(horizontal )?flip|RandomHorizontalFlip|mirror|augmentation.{0,80}(label|direction|orientation)|"
      r"left.{0,20}right")
def hflip_augment_direction_labels(fixed: bool = False):
    seed(0)
    random.seed(0)
    xt, yt = _arrows(1500, 36)
    xv, yv = _arrows(400, 37)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, padding=1),
                          nn.ReLU(), nn.Flatten(), nn.Linear(16 * 36, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(ArrowImages(xt, yt, True, not fixed), 32),
                val_loader=loader(ArrowImages(xv, yv, False, False), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


fix("hflip_augment_direction_labels", fixed_of(hflip_augment_direction_labels), plain_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 5. Leaf-disease scans stored as img_0.npy ... img_1499.npy with labels in a CSV in numeric order; the Dataset
#    lists the folder and sorts the names with sorted(), which is lexicographic (img_0, img_1, img_10, img_100,
#    ...), so file i gets label i of a different file.


def list_folder(files: dict, s: int) -> list:
    names = list(files)
    random.Random(s).shuffle(names)  # os.listdir: arbitrary order
    return names


def natural_key(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


class LeafScans(Dataset):
    def __init__(self, files, labels_csv, fixed):
        names = list_folder(files, 5)
        self.names = sorted(names, key=natural_key) if fixed else sorted(names)
        self.files, self.labels = files, labels_csv

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        return torch.from_numpy(self.files[self.names[i]]), int(self.labels[i])


def _scans(n, s):
    g = gen(s)
    centers = torch.randn(3, 24, generator=gen(381)) * 1.5
    y = torch.randint(0, 3, (n,), generator=g)
    x = centers[y] + torch.randn(n, 24, generator=g)
    files = {f"img_{i}.npy": x[i].numpy() for i in range(n)}
    return files, y.tolist()


@case("filenames_sorted_lexicographically", "data",
      "The Dataset pairs sorted(os.listdir(folder)) with the CSV labels in numeric order, but sorted() is "
      "lexicographic (img_0, img_1, img_10, img_100, ...), so almost every file gets another file's label (sort "
      "with a numeric/natural key or look the label up by file name).",
      r"sorted\(|lexicographic|natural (sort|order)|(alphabetical|string) (sort|order)|img_10|"
      r"(file ?names?|files).{0,60}(order|sort).{0,60}label|labels?.{0,60}(misaligned|mismatch|shifted|wrong file)")
def filenames_sorted_lexicographically(fixed: bool = False):
    seed(0)
    files_t, labels_t = _scans(1500, 38)
    files_v, labels_v = _scans(400, 39)
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(LeafScans(files_t, labels_t, fixed), 32),
                val_loader=loader(LeafScans(files_v, labels_v, fixed), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss())


fix("filenames_sorted_lexicographically", fixed_of(filenames_sorted_lexicographically), plain_acc, "val accuracy")
