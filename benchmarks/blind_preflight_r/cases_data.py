"""Set r, family data: what the loaders deliver is not what the model should learn from or be judged on."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_r.registry import case, eval_acc, eval_rmse, fix, fixed_of, gen, loader, seed


def acc(m, kw):
    return eval_acc(m, kw["val_loader"], lambda mm, b: (mm(b[0]).argmax(-1), b[1]))


class SmallCNN(nn.Module):
    def __init__(self, c=4):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                                 nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, c))

    def forward(self, x):
        return self.net(x)


# --- 1. road signs: pixels /255 in the training pipeline only -----------------------------------------------------


def signs(n, s):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    img = torch.rand(n, 1, 12, 12, generator=g) * 60
    for i in range(n):
        k = int(y[i])
        if k == 0:
            img[i, 0, 5:7, :] += 180
        elif k == 1:
            img[i, 0, :, 5:7] += 180
        elif k == 2:
            img[i, 0].diagonal().add_(180)
        else:
            img[i, 0, 2:10, 2:10] += 90
    return img.clamp(0, 255), y


def sign(fixed=False):
    seed(0)
    x, y = signs(1200, 61)
    vx, vy = signs(400, 62)
    return dict(model=(model := SmallCNN()), optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x / 255.0, y), 32),
                val_loader=loader(TensorDataset(vx / 255.0 if fixed else vx, vy), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("signs_val_pixels_not_scaled", "data",
     "Training images are divided by 255 but the validation images are fed as raw 0-255 pixels, so validation inputs "
     "are 255x larger than anything the model was trained on.",
     r"255|(validation|val|test) (images?|inputs?|pixels?|data|set).{0,80}(not|never|without) (been )?(scaled|normali[sz]ed|"
     r"divided|rescaled|preprocessed)|(scal|normali[sz]|preprocess)\w* (only )?(differently|inconsistently|only (for|in|on) "
     r"(the )?train)|(same|identical) (preprocessing|scaling|normali[sz]ation) (to|for|on) (the )?(validation|val|test)")(sign)
fix("signs_val_pixels_not_scaled", fixed_of(sign), acc, "val accuracy")

# --- 2. arrow direction: random horizontal flip on a left/right label ---------------------------------------------


def arrows(n, s):
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)    # 0 left, 1 right, 2 up, 3 down
    base = torch.zeros(12, 12)
    base[5:7, 2:10] = 1
    base[3:9, 2] = 1
    base[4:8, 3] = 1                                # arrow head on the left
    img = torch.empty(n, 1, 12, 12)
    for i in range(n):
        a = base
        if y[i] == 1:
            a = base.flip(1)
        elif y[i] == 2:
            a = base.T
        elif y[i] == 3:
            a = base.T.flip(0)
        img[i, 0] = a
    return img + 0.3 * torch.randn(n, 1, 12, 12, generator=g), y


class FlipAugmented(Dataset):
    def __init__(self, x, y, flip):
        self.x, self.y, self.flip = x, y, flip
        self.g = torch.Generator().manual_seed(63)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        img = self.x[i]
        if self.flip and torch.rand(1, generator=self.g) < 0.5:
            img = img.flip(-1)                      # transforms.RandomHorizontalFlip()
        return img, self.y[i]


def arrow(fixed=False):
    seed(0)
    x, y = arrows(1200, 64)
    vx, vy = arrows(400, 65)
    return dict(model=(model := SmallCNN()), optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(FlipAugmented(x, y, flip=not fixed), 32),
                val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False), loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("arrows_horizontal_flip_swaps_label", "data",
     "RandomHorizontalFlip is applied to arrow-direction images whose labels include left and right, without swapping "
     "the label, so half the flipped 'left' arrows are trained as left while pointing right (and vice versa).",
     r"(horizontal(ly)?|left[- /]right|hflip|mirror)\w*.{0,120}(flip|mirror).{0,120}(label|class|direction)|(flip|mirror)\w*.{0,80}"
     r"(changes?|swaps?|inverts?|reverses?) (the )?(label|class|direction|meaning)|label[- ](changing|altering|preserving)|"
     r"(not|isn't|is not) (label[- ])?invariant (to|under) (horizontal )?(flip|mirror)")(arrow)
fix("arrows_horizontal_flip_swaps_label", fixed_of(arrow), acc, "val accuracy")

# --- 3. insurance claims: pd.get_dummies on each split, missing column padded at the end ---------------------------

REGIONS = ["north", "south", "east", "west", "central", "coast"]


def claims(n, s, regions):
    g = np.random.default_rng(s)
    reg = g.choice(regions, n)
    age = g.normal(40, 12, n)
    effect = {r: e for r, e in zip(REGIONS, [-2.0, -1.0, 0.0, 1.0, 2.0, 3.0])}
    y = np.array([effect[r] for r in reg]) + 0.03 * (age - 40) + 0.2 * g.standard_normal(n)
    return reg, age, y


def dummies(reg, age, columns=None):
    cats = sorted(set(reg)) if columns is None else columns      # pd.get_dummies(df, columns=["region"])
    onehot = np.array([[r == c for c in cats] for r in reg], dtype=np.float32)
    return np.concatenate([((age - 40) / 12)[:, None].astype(np.float32), onehot], 1), cats


def claim(fixed=False):
    seed(0)
    reg, age, y = claims(1500, 66, REGIONS)
    vreg, vage, vy = claims(400, 67, [r for r in REGIONS if r != "coast" and r != "central"][:3] + ["coast"])  # no central, west
    x, cols = dummies(reg, age)
    if fixed:
        vx, _ = dummies(vreg, vage, cols)                          # reindex to the training columns
    else:
        vx, _ = dummies(vreg, vage)
        vx = np.pad(vx, ((0, 0), (0, x.shape[1] - vx.shape[1])))    # "shape mismatch: 5 vs 7 features" -> pad zeros
    model = nn.Sequential(nn.Linear(7, 32), nn.ReLU(), nn.Linear(32, 1))
    t = lambda a: torch.tensor(a, dtype=torch.float32)   # noqa: E731
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(t(x), t(y)[:, None]), 32),
                val_loader=loader(TensorDataset(t(vx), t(vy)[:, None]), 100, shuffle=False), loss_fn=nn.MSELoss(), max_steps=300)


case("claims_get_dummies_per_split", "data",
     "pd.get_dummies is run separately on the train and validation frames; validation lacks two regions, so its "
     "one-hot columns are fewer and in other positions, and padding zeros at the end misaligns every region column.",
     r"get_dummies|one[- ]hot.{0,80}(separately|each split|independently|columns? (differ|mismatch|misalign|order))|(dummy|one[- ]hot|"
     r"categor\w*) columns?.{0,80}(misalign|mismatch|differ|shifted|out of order|do not match|don't match)|reindex|"
     r"(columns?|features?) (are |were )?(misaligned|shifted|in (a )?different (order|positions?))")(claim)
fix("claims_get_dummies_per_split", fixed_of(claim), lambda m, kw: eval_rmse(m, kw["val_loader"], lambda mm, b: (mm(b[0]), b[1])),
    "val RMSE", higher=False)

# --- 4. bearing faults: CSV sorted by fault type, split by position ---------------------------------------------


def faults(n, s, probs=(0.2, 0.2, 0.2, 0.2, 0.2)):
    g = gen(s)
    protos = torch.randn(5, 16, generator=gen(68)) * 1.2
    y = torch.multinomial(torch.tensor(probs), n, replacement=True, generator=g)
    return protos[y] + torch.randn(n, 16, generator=g), y


_TEST = faults(500, 70)


def fault(fixed=False):
    seed(0)
    x, y = faults(2000, 69, (0.23, 0.23, 0.23, 0.23, 0.08))   # cage cracks are rare
    order = torch.argsort(y, stable=True)                 # the export is grouped by fault type
    x, y = x[order], y[order]
    if fixed:
        perm = torch.randperm(len(y), generator=gen(71))
        x, y = x[perm], y[perm]
    cut = int(0.8 * len(y))                               # train_test_split(X, y, test_size=0.2, shuffle=False)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:cut], y[:cut]), 32),
                val_loader=loader(TensorDataset(x[cut:], y[cut:]), 100, shuffle=False), loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("faults_sorted_rows_split_without_shuffle", "data",
     "The rows are sorted by fault type and split into train/validation by position (train_test_split with "
     "shuffle=False), so the last fault type lands entirely in validation and is never seen in training.",
     r"sorted|ordered by (label|class|target|fault)|grouped by (label|class|target|fault)|split (by position|without shuffl|"
     r"before shuffl)|shuffle ?= ?false.{0,60}(split|train_test_split)|train_test_split.{0,80}(shuffle|stratif)|stratif|"
     r"(never|not) (seen|present|appear\w*) in (the )?train")(fault)
fix("faults_sorted_rows_split_without_shuffle", fixed_of(fault),
    lambda m, kw: eval_acc(m, loader(TensorDataset(*_TEST), 100, shuffle=False), lambda mm, b: (mm(b[0]).argmax(-1), b[1])),
    "accuracy on a held-out balanced test set")

# --- 5. soil moisture: the validation season standardised with its own mean and std ------------------------------


def soil(n, s, shift):
    g = gen(s)
    x = torch.randn(n, 6, generator=g) * 2 + 10 + shift
    y = (0.5 * (x[:, 0] - 10) + 0.3 * (x[:, 1] - 10) + 0.1 * torch.randn(n, generator=g))[:, None]
    return x, y


def soil_case(fixed=False):
    seed(0)
    x, y = soil(1500, 72, 0.0)
    vx, vy = soil(400, 73, 1.5)                           # a wetter season
    mean, std = x.mean(0), x.std(0)
    vmean, vstd = (mean, std) if fixed else (vx.mean(0), vx.std(0))   # StandardScaler().fit_transform(val)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset((x - mean) / std, y), 32),
                val_loader=loader(TensorDataset((vx - vmean) / vstd, vy), 100, shuffle=False), loss_fn=nn.MSELoss(), max_steps=300)


case("soil_val_standardised_with_own_stats", "data",
     "The validation features are standardised with their own mean and std (scaler fit_transform on the validation "
     "split) instead of the training statistics, which erases the season's real shift the target depends on.",
     r"(own|its|their) (mean|statistics|stats)|fit_transform.{0,60}(val|test)|(fit|refit)\w* (the )?(scaler|standardi[sz]er|"
     r"normali[sz]er) (on|to) (the )?(val|test)|(training|train) (mean|statistics|stats).{0,40}(instead|rather|not)|"
     r"(val|validation|test) (mean|statistics|stats).{0,40}(instead|rather|not)")(soil_case)
fix("soil_val_standardised_with_own_stats", fixed_of(soil_case),
    lambda m, kw: eval_rmse(m, kw["val_loader"], lambda mm, b: (mm(b[0]), b[1])), "val RMSE", higher=False)
