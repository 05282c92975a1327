"""Data: what the loader hands the model is not the data the user meant (splits, augmentation, preprocessing,
label maps, Dataset code)."""

from __future__ import annotations

import random

import torch
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, TensorDataset

from benchmarks.blind_preflight_ah.registry import acc_of, acc_on, batches, case, fix, fixed_of, gen, loader, seed

_argmax_acc = acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))


def species(n: int, s: int, d: int = 8, c: int = 4):
    """Iris-like measurements: 4 species, each a Gaussian cloud around its own centre."""
    g = gen(600)
    centres = torch.randn(c, d, generator=g) * 1.6
    g = gen(s)
    y = torch.arange(n) % c
    x = centres[y] + torch.randn(n, d, generator=g)
    return x, y

# --------------------------------------------------------------------------------------------------------------
# Species classification: the CSV is sorted by species and the split is train = rows[:75%], val = rows[75%:].


def sorted_split(fixed: bool = False):
    seed(0)
    x, y = species(1200, 601)
    order = torch.argsort(y, stable=True)              # the file lists the species one after the other
    x, y = x[order], y[order]
    if fixed:
        perm = torch.randperm(len(y), generator=gen(602))
        x, y = x[perm], y[perm]
    cut = int(0.75 * len(y))
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:cut], y[:cut]), 32),
                val_loader=loader(TensorDataset(x[cut:], y[cut:]), 300, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


case("ah_split_of_label_sorted_rows", "data",
     "The rows are sorted by species and the split takes the first 75% for training and the last 25% for "
     "validation without shuffling first, so the training set contains only 3 of the 4 species and the validation "
     "set only the fourth: the model never sees one class and the validation set holds nothing else.",
     r"\b(class(es)?|labels?|species)\b.{0,80}(never|not|absent|missing|only) .{0,40}\b(train(ing|_loader|_set|"
     r"_data)?|seen)\b|"
     r"\btrain(ing)? (set|split|data|labels?) .{0,60}(lacks?|misses|missing|without|no|only \d+ of)|"
     r"(validation|val|test) (set|split|data|labels?).{0,80}(unseen|not in (the )?train|never (seen|in)|absent|"
     r"disjoint|"
     r"only (one|1|a single) class|different classes)|sorted|shuffl\w*.{0,40}(before|split)|(split|slice)\w*.{0,60}"
     r"(shuffl|order)|stratif")(sorted_split)

# --------------------------------------------------------------------------------------------------------------
# Road-marking segmentation: random horizontal flips drawn separately for the image and for its mask.


def markings(n: int, s: int, size: int = 16):
    """A bright marking (a short bar) at a random, usually off-centre place; mask = its pixels."""
    g = gen(s)
    images = 0.5 * torch.randn(n, 1, size, size, generator=g)
    masks = torch.zeros(n, size, size, dtype=torch.long)
    for k in range(n):
        r = int(torch.randint(1, size - 5, (1,), generator=g))
        c = int(torch.randint(0, size - 5, (1,), generator=g))
        masks[k, r:r + 5, c:c + 4] = 1
    images += 1.5 * masks.unsqueeze(1)
    return images, masks


class RandomHFlip:
    def __call__(self, t):
        return t.flip(-1) if random.random() < 0.5 else t


class MarkingDataset(Dataset):
    def __init__(self, images, masks, augment, joint=False):
        self.images, self.masks, self.augment, self.joint = images, masks, augment, joint
        self.transform, self.target_transform = RandomHFlip(), RandomHFlip()

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image, mask = self.images[i], self.masks[i]
        if self.augment and self.joint:
            if random.random() < 0.5:
                image, mask = image.flip(-1), mask.flip(-1)
        elif self.augment:
            image, mask = self.transform(image), self.target_transform(mask)   # each draws its own coin
        return image, mask


class MarkingNet(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1),
                                 nn.ReLU(), nn.Conv2d(width, 2, 1))

    def forward(self, x):
        return self.net(x)


def mask_flip(fixed: bool = False):
    seed(0)
    x, m = markings(512, 611)
    xv, mv = markings(128, 612)
    model = MarkingNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=DataLoader(MarkingDataset(x, m, augment=True, joint=fixed), batch_size=16, shuffle=True,
                                        generator=torch.Generator().manual_seed(1234)),
                val_loader=DataLoader(MarkingDataset(xv, mv, augment=False), batch_size=64),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


case("ah_image_and_mask_flipped_independently", "data",
     "The segmentation Dataset applies RandomHorizontalFlip to the image and, through a separate target_transform, "
     "to the mask, each drawing its own coin, so half of the training pairs have the mask mirrored relative to its "
     "image and the model is taught to mark the marking's mirror position as often as the marking.",
     r"(image|input)s?\b.{0,60}(mask|target|label)s?\b.{0,80}(independent|separate|different random|not (the )?same|"
     r"mismatch|misalign|out of sync|mirror)|(mask|target|label)s?\b.{0,60}(image|input)s?\b.{0,60}(independent|"
     r"separate|"
     r"not (the )?same|mismatch|misalign|out of sync|mirror)|(augment\w*|flip\w*|transform\w*).{0,80}"
     r"(independent|separate|own (coin|random)|not (jointly|together)|jointly|same random)|target_transform|"
     r"(image|input|mask|target)s?\b.{0,80}(not |un)?synchroni[sz]ed|(flip|augment)\w*.{0,60}out of sync")(mask_flip)

# --------------------------------------------------------------------------------------------------------------
# Customer segmentation from raw attributes: StandardScaler done by hand with mean/std along axis=1 (per row).


def customers(n: int, s: int):
    """Income (~ 55,000), age (~ 40), tenure months (~ 30), visits/month (~ 6), basket (~ 45), 3 ratios (~ 0.5)."""
    g = gen(s)
    z = torch.randn(n, 8, generator=g)
    scale = torch.tensor([15_000.0, 12.0, 15.0, 3.0, 15.0, 0.15, 0.15, 0.15])
    centre = torch.tensor([55_000.0, 40.0, 30.0, 6.0, 45.0, 0.5, 0.5, 0.5])
    raw = centre + scale * z
    w = torch.randn(8, 3, generator=gen(621))
    y = (z @ w + 0.7 * torch.stack([z[:, 1] * z[:, 3], z[:, 5].abs(), -z[:, 6] * z[:, 0]], 1)).argmax(1)
    return raw, y


def standardise(x_train, *others, fixed):
    axis = 0 if fixed else 1          # the bug: statistics over each row's 8 different attributes
    mean, std = x_train.mean(axis, keepdim=True), x_train.std(axis, keepdim=True)
    if fixed:
        return [(x - mean) / std for x in (x_train, *others)]
    return [(x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True) for x in (x_train, *others)]


def row_standardised(fixed: bool = False):
    seed(0)
    x, y = customers(2400, 622)
    xv, yv = customers(800, 623)
    x, xv = standardise(x, xv, fixed=fixed)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


case("ah_features_standardised_per_row", "data",
     "The hand-written standardisation takes the mean and std over axis=1, across each customer's 8 different "
     "attributes, instead of over axis=0 per attribute: income (about 55,000) dominates every row, so after scaling "
     "income is always about +2.5 and the other 7 columns all sit near -0.35 with differences of about 1e-3, and the "
     "information in them is gone.",
     r"axis ?= ?1|row[- ]?wise|(per|each|every) (row|sample|example|record|customer)\b.{0,60}(normali[sz]|"
     r"standardi[sz]|scal)|"
     r"(normali[sz]|standardi[sz]|scal)\w*.{0,60}(per|each|every|across|over|along) (the )?(row|sample|example|"
     r"record)s?\b|"
     r"(across|over) (the )?(features|columns|attributes) (instead|rather)|axis ?= ?0|"
     r"(columns?|features?)\b.{0,60}(constant|near-?constant|(almost|nearly) (the same|identical)|no variance|"
     r"tiny variance|collapsed)")(row_standardised)

# --------------------------------------------------------------------------------------------------------------
# Skin-lesion classification from two clinics: each clinic's folder builds its own class_to_idx from the classes it
# has, and clinic B has no 'melanoma' folder, so its later classes are numbered one lower.

LESIONS = ["benign", "carcinoma", "melanoma", "nevus", "keratosis"]


def lesion_features(n: int, s: int, classes: list[str]):
    g = gen(700)
    centres = torch.randn(len(LESIONS), 12, generator=g) * 1.3
    g = gen(s)
    names = [classes[k % len(classes)] for k in range(n)]
    true = torch.tensor([LESIONS.index(c) for c in names])
    x = centres[true] + torch.randn(n, 12, generator=g)
    return x, names


class ClinicFolder(Dataset):
    """Like ImageFolder: class_to_idx from the sorted class folders the clinic has (or a shared one)."""

    def __init__(self, x, names, class_to_idx=None):
        self.class_to_idx = class_to_idx or {c: i for i, c in enumerate(sorted(set(names)))}
        self.x, self.y = x, torch.tensor([self.class_to_idx[c] for c in names])

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def lesion_test():
    x, names = lesion_features(1000, 703, LESIONS)
    return batches(x, torch.tensor([sorted(LESIONS).index(c) for c in names]), 500)


def per_clinic_index(fixed: bool = False):
    seed(0)
    xa, na = lesion_features(1000, 701, LESIONS)
    xb, nb = lesion_features(1000, 702, [c for c in LESIONS if c != "melanoma"])
    shared = {c: i for i, c in enumerate(sorted(LESIONS))} if fixed else None
    clinic_a = ClinicFolder(xa, na, shared)
    clinic_b = ClinicFolder(xb, nb, shared)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 5))
    test_x = torch.cat([b[0] for b in lesion_test()])
    test_y = torch.cat([b[1] for b in lesion_test()])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=DataLoader(ConcatDataset([clinic_a, clinic_b]), batch_size=32, shuffle=True,
                                        generator=torch.Generator().manual_seed(1234)),
                val_loader=loader(TensorDataset(test_x, test_y), 500, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


case("ah_label_index_built_per_clinic", "data",
     "The training set concatenates two clinics' folders, each with its own ImageFolder-style class_to_idx built from "
     "the classes it contains; clinic B has no melanoma folder, so its nevus images get index 3, which means melanoma "
     "in clinic A, and one training label in eight is wrong.",
     r"class_to_idx|(label|class) (map|mapping|index|indices|encoding|encoder|ids?)\w*.{0,80}(differ|inconsistent|"
     r"mismatch|shift|per (folder|clinic|source|split|dataset|site)|separate)|(differ|inconsistent|mismatch)\w*.{0,60}"
     r"(label|class) (map|mapping|indices|ids?|encoding)|(folder|clinic|source|site|split)s?\b.{0,60}(own|separate|"
     r"different) (label|class)|(same|identical) (inputs?|features?).{0,60}(different|conflicting) (labels?|classes)|"
     r"(labels?|classes) (are )?(shifted|off by one)")(per_clinic_index)

# --------------------------------------------------------------------------------------------------------------
# Vibration regression: __getitem__ normalises a row of the stored tensor in place (x -= mean; x /= std), so
# every epoch normalises the already-normalised data again.


class VibrationDataset(Dataset):
    def __init__(self, x, y, mean, std, fixed=False):
        self.x, self.y, self.mean, self.std, self.fixed = x, y, mean, std, fixed

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i]                      # a view into the stored tensor
        if self.fixed:
            x = (x - self.mean) / self.std
        else:
            x -= self.mean
            x /= self.std
        return x, self.y[i]


def vibration(n: int, s: int, d: int = 10):
    g = gen(s)
    z = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=gen(711)) / d ** 0.5
    y = torch.tanh(z @ w) * 2 + 0.5 * z[:, 0] * z[:, 1] + 0.1 * torch.randn(n, generator=g)
    return 20.0 + 4.0 * z, y.unsqueeze(1)       # raw sensor units: mean 20, std 4


def inplace_normalise(fixed: bool = False):
    seed(0)
    x, y = vibration(512, 712)
    xv, yv = vibration(512, 713)
    mean, std = x.mean(0), x.std(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=DataLoader(VibrationDataset(x, y, mean, std, fixed), batch_size=32, shuffle=True,
                                        generator=torch.Generator().manual_seed(1234)),
                val_loader=DataLoader(VibrationDataset(xv, yv, mean, std, fixed), batch_size=512),
                loss_fn=nn.MSELoss(), max_steps=3000)


case("ah_getitem_normalises_in_place", "data",
     "VibrationDataset.__getitem__ takes x = self.x[i], a view of the stored tensor, and normalises it in place "
     "(x -= mean; x /= std), so the stored data is normalised again at every epoch: after one epoch the inputs are "
     "z-scores, after two they are all about -5 with a spread of 0.25, and within a few epochs every row is the same "
     "constant vector.",
     r"in[- ]place|x ?-= ?|/=|(stored|underlying|dataset)\b.{0,60}(modified|mutated|changed|overwritten)|"
     r"(modif|mutat|overwrit)\w*.{0,60}(stored|underlying|dataset|storage)|"
     r"(inputs?|data|batch(es)?|distribution)\b.{0,60}(drift|shift|change)\w*.{0,40}(epoch|between|across|over)|"
     r"(differ|change)\w*.{0,40}(between|from|across) epochs?|(normali[sz]\w*|standardi[sz]\w*) (again|twice|"
     r"repeatedly)")(inplace_normalise)

# --------------------------------------------------------------------------------------------------------------
# The one-line fixes verify.py trains next to each case, and the metric both are scored on.


def _species_test():
    x, y = species(800, 604)
    return batches(x, y, 400)


def _marking_soft_dice(model, kw):
    """Soft Dice of the marking class: 2 * sum(p * t) / (sum(p) + sum(t)) with p the predicted probability."""
    def fn(m, b):
        p = m(b[0]).float().softmax(1)[:, 1]
        t = (b[1] == 1).float()
        return 2 * (p * t).sum().item(), (p.sum() + t.sum()).item()
    from benchmarks.blind_preflight_ah.registry import mean_over
    return mean_over(model, kw["val_loader"], fn)


def _vibration_rmse(model, kw):
    x, y = vibration(512, 714)
    xtr, _ = vibration(512, 712)
    mean, std = xtr.mean(0), xtr.std(0)
    from benchmarks.blind_preflight_ah.registry import mean_over
    return mean_over(model, [((x - mean) / std, y)],
                     lambda m, b: (((m(b[0]) - b[1]) ** 2).sum().item(), len(b[1]))) ** 0.5


fix("ah_split_of_label_sorted_rows", fixed_of(sorted_split), acc_on(_species_test), "accuracy on a shuffled test set")
fix("ah_image_and_mask_flipped_independently", fixed_of(mask_flip), _marking_soft_dice,
    "val soft Dice of the marking class")
fix("ah_features_standardised_per_row", fixed_of(row_standardised), _argmax_acc, "val accuracy")
fix("ah_label_index_built_per_clinic", fixed_of(per_clinic_index), acc_on(lesion_test), "test accuracy (one label map)")
fix("ah_getitem_normalises_in_place", fixed_of(inplace_normalise), _vibration_rmse, "test RMSE", higher=False)
