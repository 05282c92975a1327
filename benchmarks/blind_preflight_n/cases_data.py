"""Set n, family data: what reaches the model is not what the data says (no crash)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset, WeightedRandomSampler

from benchmarks.blind_preflight_n.cases_targets import foreground_iou
from benchmarks.blind_preflight_n.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed, split

# --- 1. Field-boundary segmentation: image and mask flipped by separate coin tosses -----------------------------
# Source: https://packtpub.com/en-ec/product/hands-on-computer-vision-with-tensorflow-2-9781788830645/chapter/training-on-complex-and-scarce-datasets-10/section/example-augmenting-images-for-our-autonomous-driving-application-ch10lvl1sec38
# ("if we call tf.image.random_flip_left_right() once for the input image and once for the ground truth label map,
# there is only a half chance that both images will undergo the same transformation").

def field_tiles(n: int, s: int, size: int = 24):
    """One field per tile, away from the centre line, so a horizontal flip always moves it."""
    g = gen(s)
    img = 0.4 * torch.randn(n, 1, size, size, generator=g)
    mask = torch.zeros(n, 1, size, size)
    for i in range(n):
        h, w = torch.randint(4, 8, (2,), generator=g).tolist()
        y0 = int(torch.randint(0, size - h, (1,), generator=g))
        left = bool(torch.rand(1, generator=g) < 0.5)
        x0 = int(torch.randint(0, size // 2 - w - 1, (1,), generator=g))
        if not left:
            x0 = size - x0 - w
        mask[i, 0, y0:y0 + h, x0:x0 + w] = 1.0
    return img + mask, mask


class FieldTiles(Dataset):
    def __init__(self, img, mask, augment: bool, paired: bool):
        self.img, self.mask, self.augment, self.paired = img, mask, augment, paired

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        img, mask = self.img[i], self.mask[i]
        if self.augment:
            if self.paired:
                if torch.rand(1) < 0.5:
                    img, mask = img.flip(-1), mask.flip(-1)
            else:
                if torch.rand(1) < 0.5:                  # random_flip_left_right(image)
                    img = img.flip(-1)
                if torch.rand(1) < 0.5:                  # random_flip_left_right(mask)
                    mask = mask.flip(-1)
        return img, mask


@case("fields_image_mask_flipped_separately", "data",
      bug="The training Dataset flips the image and the mask with two separate torch.rand(1) < 0.5 coin tosses, so "
          "half of the training pairs have the mask mirrored relative to its image and the segmenter is taught that "
          "a field is foreground only half of the time.",
      cause_pattern=r"(image|img) and (the |its )?(mask|label map).{0,100}(independent\w*|separate\w*|different|own|two) "
                    r"(random|coin|flips?|draws?|transforms?|tosses)"
                    r"|(independent\w*|separate\w*|two) (random )?(flips?|draws?|transforms?|augmentations?|coin tosses)"
                    r".{0,80}(image|mask)|(same|one|shared|single) (random )?(flip|transform|draw|coin)\w*.{0,60}"
                    r"(both|image and (the )?mask)|mask\w*.{0,80}(misaligned|not aligned|out of sync|mirrored"
                    r"|no longer match)|(misaligned|out of sync).{0,60}mask")
def fields_image_mask_flipped_separately(fixed: bool = False):
    seed(0)
    img, mask = field_tiles(640, 22)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 1, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(FieldTiles(img[:512], mask[:512], augment=True, paired=fixed), 16),
                val_loader=loader(FieldTiles(img[512:], mask[512:], augment=False, paired=True), 128, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


fix("fields_image_mask_flipped_separately", fixed_of(fields_image_mask_flipped_separately), foreground_iou,
    "val foreground IoU")


# --- 2. Plankton images: class folders '1'..'12' indexed lexicographically for training, numerically for validation ---
# Source: http://kler.cn/a/107755.html (image_dataset_from_directory reads classes in the order
# ['1', '10', '11', '12', '13', '14', '15', '16', '2', ...], not 1, 2, 3, ...: the evaluation must use the same order).

FOLDERS = [str(k) for k in range(1, 13)]


def plankton(n: int, s: int, d: int = 24):
    """Feature vectors of plankton crops; each sample carries the name of the folder it was read from."""
    g = gen(s)
    proto = torch.randn(len(FOLDERS), d, generator=g)
    folder = torch.randint(0, len(FOLDERS), (n,), generator=g)
    return proto[folder] + 0.8 * torch.randn(n, d, generator=g), [FOLDERS[k] for k in folder.tolist()]


@case("plankton_val_labels_numeric_train_lexicographic", "data",
      bug="The training labels come from the folder names sorted as strings (class_to_idx of sorted(os.listdir): "
          "'1', '10', '11', '12', '2', ...) while the validation labels are int(folder) - 1: the two sets use "
          "different class-index mappings, so 11 of the 12 classes are scored against the wrong index.",
      cause_pattern=r"class[_ ]?to[_ ]?idx|(lexicographic\w*|alphabetical\w*|as strings?|string) (sort|order)"
                    r"|sorted\(.{0,40}key\s*=\s*int|'10',? (sorts |comes )?before '2'"
                    r"|label (mappings?|encodings?|indices|orders?) (differ|mismatch|don't match|do not match|disagree"
                    r"|(are )?inconsistent)|(differ\w*|mismatch\w*|inconsistent) (class[- ]index|label|class) "
                    r"(mappings?|encodings?|orders?)|int\(folder\)")
def plankton_val_labels_numeric_train_lexicographic(fixed: bool = False):
    seed(0)
    x, names = plankton(2400, 23)
    lexicographic = {name: k for k, name in enumerate(sorted(set(FOLDERS)))}       # what the folder loader does
    y_train = torch.tensor([lexicographic[nm] for nm in names[:1920]])
    if fixed:
        y_val = torch.tensor([lexicographic[nm] for nm in names[1920:]])
    else:
        y_val = torch.tensor([int(nm) - 1 for nm in names[1920:]])               # "class 1 is index 0"
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 12))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1920], y_train), 64),
                val_loader=loader(TensorDataset(x[1920:], y_val), 240, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("plankton_val_labels_numeric_train_lexicographic", fixed_of(plankton_val_labels_numeric_train_lexicographic),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --- 3. Bearing faults: a class-sorted table split into train / val without shuffling --------------------------
# Source: https://github.com/keras-team/keras/issues/8346 ("splitting 20% of data for validation takes the last 20% of
# the data which is in this case the whole class 5"; shuffling before the split fixed the zero validation accuracy).

def bearing_table(per_class: int, s: int, classes: int = 5, d: int = 16):
    """Vibration features exported one test-rig condition after another: the rows are sorted by fault class."""
    g = gen(s)
    proto = torch.randn(classes, d, generator=g)
    y = torch.arange(classes).repeat_interleave(per_class)
    return proto[y] + 0.9 * torch.randn(len(y), d, generator=g), y


@case("bearing_split_sorted_rows", "data",
      bug="The table is sorted by fault class (one rig condition after another) and split with x[:960] / x[960:] "
          "without shuffling first, so validation is the whole of the last class, which never appears in training.",
      cause_pattern=r"(not|never|without) (shuffl\w*|randomi[sz]\w*|permut\w*)( the rows)? before (the )?split"
                    r"|split\w* (before|without) (shuffl|randomi|permut)|sorted by (class|label|fault|condition)"
                    r"|(val|validation)\w* (set |split )?(contains|has|is|holds) only (one|a single|the last|class)"
                    r"|class(es)? (\d+ )?(missing|absent|never seen|unseen|not present) (from|in) (the )?train"
                    r"|train_test_split.{0,60}shuffle|(stratif\w*)")
def bearing_split_sorted_rows(fixed: bool = False):
    seed(0)
    x, y = bearing_table(240, 24)
    if fixed:
        order = torch.randperm(len(y), generator=gen(25))
        x, y = x[order], y[order]
    (xt, yt), (xv, yv) = split(x, y, 960)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 5))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 32),
                val_loader=loader(TensorDataset(xv, yv), 240, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("bearing_split_sorted_rows", fixed_of(bearing_split_sorted_rows),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")


# --- 4. Whale-call detector: WeightedRandomSampler given one weight per class -----------------------------------
# Source: https://github.com/deep-voice/soundbay/pull/49 ("WeightedRandomSampler ... assigns weights to *each sample*
# and so it actually will choose the same samples (the first and second)": the weights must be given per sample).

CALL_PRIORS = [0.7, 0.15, 0.1, 0.05]


def call_features(n: int, s: int, d: int = 20):
    g = gen(s)
    y = torch.multinomial(torch.tensor(CALL_PRIORS), n, replacement=True, generator=g)
    proto = torch.randn(len(CALL_PRIORS), d, generator=g)
    return proto[y] + 1.0 * torch.randn(n, d, generator=g), y


def build_whale_sampler(fixed: bool = False):
    seed(0)
    x, y = call_features(3000, 26)
    (xt, yt), (xv, yv) = split(x, y, 2400)
    class_weights = 1.0 / torch.bincount(yt, minlength=4).float()
    weights = class_weights[yt] if fixed else class_weights
    sampler = WeightedRandomSampler(weights, num_samples=len(yt), replacement=True,
                                    generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=DataLoader(TensorDataset(xt, yt), batch_size=64, sampler=sampler),
                val_loader=loader(TensorDataset(xv, yv), 300, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


def balanced_accuracy(model, kw):
    """Mean per-class recall over the validation calls."""
    right, total = torch.zeros(4), torch.zeros(4)
    was = model.training
    model.eval()
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            pred = model(x).argmax(-1)
            for c in range(4):
                right[c] += ((pred == c) & (y == c)).sum()
                total[c] += (y == c).sum()
    model.train(was)
    return (right / total.clamp(min=1)).mean().item()


@case("whale_sampler_weights_per_class", "data",
      bug="WeightedRandomSampler is given the 4 per-class weights (1 / class count) instead of one weight per "
          "training sample (class_weights[labels]): it draws indices from range(len(weights)), so every epoch is "
          "made of training rows 0-3 only.",
      cause_pattern=r"weightedrandomsampler.{0,200}(per[- ]sample|each (training )?(sample|example|row)|one weight per"
                    r"|len\(dataset\)|class weights|class_weights\[)|(per[- ]class|class) weights.{0,120}(sampler)"
                    r"|(only|just) (rows|samples|indices|examples) 0 ?(\.\.|-|to|through) ?3"
                    r"|(only|just) the first (4|four) (rows|samples|indices|examples)"
                    r"|class_weights?\[(labels|targets|y)")
def whale_sampler_weights_per_class(fixed: bool = False):
    return build_whale_sampler(fixed)


fix("whale_sampler_weights_per_class", fixed_of(whale_sampler_weights_per_class), balanced_accuracy,
    "val balanced accuracy")


# --- 5. Load forecasting: hourly rows shuffled before the sliding windows are cut -------------------------------
# Source: https://github.com/namjoonsuh/TimeAutoDiff/issues/4 (the sequence is shuffled and split before any
# windowing: "wouldn't this lead the created sliding window to no longer match the real sequences").

def hourly_load(n: int, s: int):
    g = gen(s)
    t = torch.arange(n, dtype=torch.float32)
    load = torch.sin(2 * math.pi * t / 24) + 0.5 * torch.sin(2 * math.pi * t / (24 * 7)) + 0.1 * torch.randn(n, generator=g)
    return load


def windows(series, width: int = 24):
    x = torch.stack([series[i:i + width] for i in range(len(series) - width)])
    return x, series[width:]


@case("load_rows_shuffled_before_windowing", "data",
      bug="The hourly rows are shuffled (series[torch.randperm(n)], like df.sample(frac=1)) before the 24-hour sliding "
          "windows are cut, so each window is 24 random hours and its target an unrelated hour: the temporal order "
          "the forecaster needs is gone.",
      cause_pattern=r"shuffl\w*.{0,100}before.{0,60}(window|sequence|lag)|(window|sequence)s?.{0,100}(after|from) "
                    r"(a |the )?shuffl|(rows|hours|time ?steps|timestamps|observations) (are |were |get )?shuffled"
                    r"|(temporal|time|chronological) order.{0,60}(lost|destroyed|broken|shuffled|scrambled|gone)"
                    r"|(destroy|break|scrambl|los)\w* (the )?(temporal|time|chronological) order"
                    r"|randperm.{0,60}(series|rows)|sample\(frac\s*=\s*1")
def load_rows_shuffled_before_windowing(fixed: bool = False):
    seed(0)
    series = hourly_load(3000, 27)
    if not fixed:
        series = series[torch.randperm(len(series), generator=gen(28))]      # "shuffle the data"
    x, y = windows(series)
    (xt, yt), (xv, yv) = split(x, y, 2400)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt, yt), 64),
                val_loader=loader(TensorDataset(xv, yv), 288, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("load_rows_shuffled_before_windowing", fixed_of(load_rows_shuffled_before_windowing),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)

