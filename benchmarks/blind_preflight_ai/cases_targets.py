"""Set ai, family targets: labels that no longer say what the user thinks (masks scaled to [0, 1] then truncated,
class codes fitted per split, prices in raw dollars, multi-hot rows under a softmax loss, a forecast window whose
target is its own last input)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_ai.cases_shapes import blob_masks, seg_fwd, seg_net
from benchmarks.blind_preflight_ai.registry import (
    acc_of,
    case,
    class_mean_acc,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
)

# ---------------------------------------------------------------------------------------------------------------
# ai_mask_to_tensor_scaled: segmentation masks put through the image transform


def to_tensor(arr: np.ndarray) -> torch.Tensor:
    """What torchvision's ToTensor does to a uint8 array: float in [0, 1] (HW -> 1HW)."""
    t = torch.from_numpy(arr).float().div(255)
    return t.unsqueeze(0) if t.dim() == 2 else t.permute(2, 0, 1)


class SegFromArrays(Dataset):
    """Images and masks stored as uint8 arrays, as read from PNG files."""

    def __init__(self, x, m, fixed):
        self.img = ((x.squeeze(1).clamp(-2, 2) + 2) / 4 * 255).round().to(torch.uint8).numpy()
        self.mask = m.numpy()
        self.fixed = fixed

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        img = (to_tensor(self.img[i]) - 0.5) / 0.25
        if self.fixed:
            mask = torch.from_numpy(self.mask[i].astype(np.int64))
        else:
            mask = to_tensor(self.mask[i]).squeeze(0).long()     # BUG: ids 1, 2 -> 1/255, 2/255 -> 0
        return img, mask


@case("ai_mask_to_tensor_scaled", "targets",
      bug="The segmentation Dataset sends the uint8 class-id mask through the same ToTensor-style transform as the "
          "image, which divides by 255; .long() then truncates the class ids 1 and 2 (now 0.004 and 0.008) to 0, "
          "so every target pixel is background and the model learns to predict background everywhere.",
      cause_pattern=r"ToTensor|to_tensor|(divid|scal)\w*.{0,40}255|/ ?255|255.{0,60}(mask|label|target)|"
                    r"(mask|label|target)s?.{0,80}(all|only|every).{0,20}(0|zero|background)|"
                    r"(single|one|only one) (class|value|label).{0,40}(mask|target|pixel)")
def mask_to_tensor_scaled(fixed: bool = False):
    seed(0)
    x, m = blob_masks(600, 12)
    model = seg_net()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(SegFromArrays(x[:450], m[:450], fixed), 16),
                val_loader=loader(SegFromArrays(x[450:], m[450:], True), 50, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=800)


fix("ai_mask_to_tensor_scaled", fixed_of(mask_to_tensor_scaled),
    lambda model, kw: class_mean_acc(model, kw["val_loader"], seg_fwd, 3),
    "val class-mean pixel accuracy (true masks)", steps=200)

# ---------------------------------------------------------------------------------------------------------------
# ai_label_codes_per_split: string labels encoded separately on each split


PLANS = np.array(["basic", "family", "premium", "student"])


def plan_rows(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 12, generator=g)
    w = torch.randn(12, 4, generator=g)
    names = PLANS[(x @ w).argmax(1).numpy()]
    return x, names


def encode_in_order_seen(names) -> dict:
    """pandas.factorize-style: codes in order of first appearance."""
    return {name: code for code, name in enumerate(dict.fromkeys(names.tolist()))}


@case("ai_label_codes_per_split", "targets",
      bug="The string class labels are turned into integer codes separately on the training and the validation "
          "split (codes in order of first appearance, as pandas.factorize / a fresh encoder per file give them), "
          "so the same plan gets a different code in each split and validation labels disagree with training labels.",
      cause_pattern=r"factoriz|LabelEncoder|encod\w*.{0,80}(separately|per split|each split|both splits|"
                    r"train\w* and (the )?val)|(different|inconsistent|mismatch\w*) (label |class )?(cod|mapping|"
                    r"encod)|(same|one) (encoder|mapping|vocab\w*).{0,40}(both|all|every) split|"
                    r"val\w* labels?.{0,80}(permut|disagree|differ|mapp)")
def label_codes_per_split(fixed: bool = False):
    seed(0)
    x, names = plan_rows(1600, 13)
    tr_names, va_names = names[:1200], names[1200:]
    train_codes = encode_in_order_seen(tr_names)
    val_codes = train_codes if fixed else encode_in_order_seen(va_names)   # BUG: refitted on the val file
    y_tr = torch.tensor([train_codes[n] for n in tr_names])
    y_va = torch.tensor([val_codes[n] for n in va_names])
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y_tr), 32),
                val_loader=loader(TensorDataset(x[1200:], y_va), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=800)


fix("ai_label_codes_per_split", fixed_of(label_codes_per_split), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy (val labels as encoded by the case)", steps=200)

# ---------------------------------------------------------------------------------------------------------------
# ai_raw_price_target: house prices in dollars


def houses(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, generator=g) / 3
    price = 240_000 + 60_000 * torch.tanh(x @ w) + 8_000 * torch.randn(n, generator=g)
    return x, price


_HX, _HP = houses(1500, 14)
PRICE_MEAN, PRICE_STD = float(_HP[:1200].mean()), float(_HP[:1200].std())


@case("ai_raw_price_target", "targets",
      bug="The regression target is the sale price in raw dollars (mean about 240,000, std about 28,000) while the "
          "inputs are standardised and the net starts with outputs near 0: MSELoss is around 6e10, Adam moves the "
          "output by about the learning rate per step, and in the whole run the predictions never reach the price "
          "scale. The target should be standardised (and the predictions scaled back).",
      cause_pattern=r"(target|label|y)s?.{0,60}(not |un)(normali[sz]|standardi[sz]|scaled)|"
                    r"(normali[sz]|standardi[sz]|scale|rescale) (the )?(target|label|y\b)|target scale|"
                    r"(raw|large|huge) (dollar|price|target)s?|(target|label)s?.{0,40}(magnitude|mean|scale).{0,40}"
                    r"(\d{3}|1e|large|huge)|StandardScaler|log1p")
def raw_price_target(fixed: bool = False):
    seed(0)
    x, price = _HX, _HP
    y = (price - PRICE_MEAN) / PRICE_STD if fixed else price
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 300, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=800)


def price_rmse(model, kw):
    """RMSE in dollars: a model trained on standardised targets has its predictions (and targets) scaled back."""
    scaled = bool(kw["val_loader"].dataset.tensors[1].abs().max() < 100)

    def fn(m, b):
        p, t = m(b[0]), b[1]
        if scaled:
            p, t = p * PRICE_STD + PRICE_MEAN, t * PRICE_STD + PRICE_MEAN
        return ((p - t) ** 2).sum().item(), len(t)
    return math.sqrt(mean_over(model, kw["val_loader"], fn))


fix("ai_raw_price_target", fixed_of(raw_price_target), price_rmse, "val RMSE in dollars", steps=200, higher=False)

# ---------------------------------------------------------------------------------------------------------------
# ai_multihot_crossentropy: multi-label tagging trained with CrossEntropyLoss


def tagged_rows(n: int, s: int, n_tags: int = 6):
    g = gen(s)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, n_tags, generator=g)
    scores = x @ w
    k = torch.randint(2, 4, (n, 1), generator=g)                      # 2 or 3 tags per item
    ranks = scores.argsort(1, descending=True).argsort(1)
    return x, (ranks < k).float()


@case("ai_multihot_crossentropy", "targets",
      bug="Each item carries 2-3 tags as a multi-hot float row, but the loss is nn.CrossEntropyLoss, which reads "
          "float targets as one probability distribution over mutually exclusive classes: the softmax splits one "
          "unit of probability among the true tags, so no tag of a multi-tag item reaches 0.5 and thresholding "
          "finds almost none. Multi-label targets need BCEWithLogitsLoss (one sigmoid per tag).",
      cause_pattern=r"BCEWithLogits\w*.{0,80}(multi|tags?|several|independent)|(multi|tags?|several).{0,80}BCEWithLogits|multi-?label|multi-?hot|(independent|per[- ]tag|per[- ]label|one) sigmoid|"
                    r"mutually exclusive|(softmax|CrossEntropy\w*).{0,80}(several|multiple|more than one) "
                    r"(tags?|labels?|classes|positives)|(rows?|targets?) (do not |don't )?sum(s)? to (1|one|more)")
def multihot_crossentropy(fixed: bool = False):
    seed(0)
    x, tags = tagged_rows(1500, 15)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], tags[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], tags[1200:]), 300, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss(), max_steps=800)


def tag_f1(model, kw):
    """Micro-F1 of the tags whose probability (as the training loss defines it: softmax under CrossEntropyLoss,
    sigmoid under BCEWithLogitsLoss) exceeds 0.5."""
    softmax = isinstance(kw["loss_fn"], nn.CrossEntropyLoss)
    tp = fp = fn_ = 0.0
    model.eval()
    with torch.no_grad():
        for xb, yb in kw["val_loader"]:
            logits = model(xb)
            prob = logits.softmax(-1) if softmax else logits.sigmoid()
            pred = (prob > 0.5).float()
            tp += (pred * yb).sum().item()
            fp += (pred * (1 - yb)).sum().item()
            fn_ += ((1 - pred) * yb).sum().item()
    model.train()
    return 2 * tp / max(2 * tp + fp + fn_, 1.0)


fix("ai_multihot_crossentropy", fixed_of(multihot_crossentropy), tag_f1, "val tag micro-F1 at p > 0.5", steps=200)

# ---------------------------------------------------------------------------------------------------------------
# ai_forecast_target_last_input: one-step-ahead forecasting from sliding windows


def sensor_series(n: int, s: int):
    g = gen(s)
    t = torch.arange(n, dtype=torch.float32)
    phase = torch.rand(2, generator=g) * 6.28
    return (torch.sin(2 * math.pi * t / 4.3 + phase[0]) + 0.7 * torch.sin(2 * math.pi * t / 7.1 + phase[1])
            + 0.1 * torch.randn(n, generator=g))


WINDOW = 16


def windows(series, target_offset):
    idx = torch.arange(len(series) - WINDOW - 1)
    x = torch.stack([series[i:i + WINDOW] for i in idx.tolist()])
    y = torch.stack([series[i + target_offset] for i in idx.tolist()])
    return x, y


_SERIES = sensor_series(1800, 16)
_VAL_X, _VAL_Y = windows(_SERIES[1400:], WINDOW)          # the true next value after each window
VAL_NEXT_STEP = [(_VAL_X[i:i + 200], _VAL_Y[i:i + 200]) for i in range(0, len(_VAL_X), 200)]


@case("ai_forecast_target_last_input", "targets",
      bug="The sliding-window builder takes the target as series[i + window - 1], the last value inside the input "
          "window, instead of series[i + window], the next one: the model learns to copy its last input (a "
          "persistence forecast) and never learns to predict the next step.",
      cause_pattern=r"off[- ]by[- ]one|i \+ window( - 1)?\]|last (value|element|step|input|observation).{0,60}"
                    r"(window|input)|(target|label|y)s?.{0,60}(inside|within|part of|equals?|same as|copy|copies)"
                    r".{0,40}(window|input)|(copy|copies|echo\w*|repeat\w*) (its|the) (last|latest) input|"
                    r"persistence|(shift|lag)\w* (the )?(target|label)s? by one")
def forecast_target_last_input(fixed: bool = False):
    seed(0)
    x, y = windows(_SERIES[:1400], WINDOW if fixed else WINDOW - 1)
    model = nn.Sequential(nn.Linear(WINDOW, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    vx, vy = windows(_SERIES[1400:], WINDOW if fixed else WINDOW - 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(vx, vy), 200, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=800)


fix("ai_forecast_target_last_input", fixed_of(forecast_target_last_input),
    rmse_of(lambda m, b: (m(b[0]), b[1]), VAL_NEXT_STEP), "RMSE of the next-step forecast (true next values)",
    steps=250, higher=False)
