"""Family ``targets``: target encoding, dtype, range, class weighting, ignored labels, label/input alignment."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_k.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
    split,
    token_sequences,
)


# --- 1. segmentation masks read as 0/255 -------------------------------------------------------------------------------
def _scans(n, s):
    g = gen(s)
    img = 0.4 * torch.randn(n, 1, 16, 16, generator=g)
    mask = torch.zeros(n, 1, 16, 16, dtype=torch.uint8)
    r = torch.randint(0, 10, (n, 2), generator=g)
    hw = torch.randint(3, 7, (n, 2), generator=g)
    for i in range(n):
        a, b, h, w = r[i, 0], r[i, 1], hw[i, 0], hw[i, 1]
        img[i, 0, a:a + h, b:b + w] += 1.0
        mask[i, 0, a:a + h, b:b + w] = 255      # as cv2.imread(..., 0) gives a binary PNG mask
    return img, mask


def lesion_unet_mask_255(fixed: bool = False):
    seed(0)
    img, mask = _scans(900, 61)
    target = mask.float() / 255.0 if fixed else mask.float()
    (xt, yt), (xv, yv) = split(img, target, 720)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(8, 1, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), batch_size=24),
                val_loader=loader(TensorDataset(xv, yv), batch_size=60, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


def _iou(model, kw):
    def fn(m, b):
        pred, true = m(b[0]) > 0, b[1] > 0
        return (pred & true).sum().item(), (pred | true).sum().item()
    return mean_over(model, kw["val_loader"], fn)


case("lesion_unet_mask_255", "targets",
     "The binary masks are loaded as 0/255 and passed to BCEWithLogitsLoss unscaled: a target of 255 is far outside "
     "[0, 1], its loss is unbounded below and pushes every logit up, so the net marks nearly everything as lesion; "
     "divide the masks by 255.",
     r"255|(targets?|labels?|masks?) (values )?(are )?(outside|out of|not in|exceed\w*) \[?0, ?1\]?|"
     r"(not|aren't) (binary|in \{?0, ?1\}?)|/ ?255|divide.{0,30}255|(loss|BCE\w*).{0,40}negative|negative (BCE|loss)",
     )(lesion_unet_mask_255)
fix("lesion_unet_mask_255", fixed_of(lesion_unet_mask_255), _iou, "val IoU", steps=250)


# --- 2. GPT-2 labels shifted by hand, shifted again inside the model ---------------------------------------------------
class LMDataset(Dataset):
    def __init__(self, ids, preshift):
        self.ids, self.preshift = ids, preshift

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        if self.preshift:                      # "the label of token t is token t+1"
            labels = torch.cat([ids[1:], torch.tensor([-100])])
        else:
            labels = ids.clone()
        return {"input_ids": ids, "labels": labels}


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=32, n_positions=16, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def gpt2_labels_preshifted(fixed: bool = False):
    seed(0)
    ids = token_sequences(1200, 16, 32, s=71)
    train, val = ids[:1000], ids[1000:]
    model = _tiny_gpt2()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                train_loader=loader(LMDataset(train, preshift=not fixed), batch_size=32),
                val_loader=loader(LMDataset(val, preshift=not fixed), batch_size=50, shuffle=False),
                loss_fn=None, max_steps=300)


def _next_token_acc(model, kw):
    def fn(m, b):
        ids = b["input_ids"]
        pred = m(input_ids=ids).logits[:, :-1].argmax(-1)
        return (pred == ids[:, 1:]).sum().item(), ids[:, 1:].numel()
    return mean_over(model, kw["val_loader"], fn)


case("gpt2_labels_preshifted", "targets",
     "The dataset shifts the labels one token left (labels[t] = input_ids[t+1]) although GPT2LMHeadModel shifts "
     "labels internally, so the model is trained to predict the token after next; pass labels = input_ids.",
     r"shift\w*.{0,60}(twice|again|internally|inside the model)|(double|two)[- ]shift|labels\s*=\s*input_ids|"
     r"pre-?shift\w*|already shifted|shifted by one|next[- ]next|token after (the )?next|t\s*\+\s*2|off[- ]by[- ]one.{0,40}labels|labels.{0,40}off[- ]by[- ]one",
     )(gpt2_labels_preshifted)
fix("gpt2_labels_preshifted", fixed_of(gpt2_labels_preshifted), _next_token_acc, "val next-token accuracy",
    steps=200)


# --- 3. continuous ratings stored as int64 ----------------------------------------------------------------------------
class RatingDataset(Dataset):
    def __init__(self, x, y, as_long):
        self.x = torch.as_tensor(x, dtype=torch.float32)
        self.y = torch.tensor(y, dtype=torch.long) if as_long else torch.tensor(y, dtype=torch.float32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def wine_rating_long_targets(fixed: bool = False):
    seed(0)
    rng = np.random.default_rng(81)
    x = rng.standard_normal((1500, 10)).astype(np.float32)
    w = rng.standard_normal(10) / np.sqrt(10)
    y = (2.5 + 2.4 * np.tanh(x @ w)).astype(np.float32)        # ratings in (0.1, 4.9)
    train = RatingDataset(x[:1200], y[:1200], as_long=not fixed)
    val = TensorDataset(torch.from_numpy(x[1200:]), torch.from_numpy(y[1200:]))
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))

    def loss_fn(model, batch):
        x, y = batch
        return F.mse_loss(model(x).squeeze(-1), y.float())

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(train, batch_size=40), val_loader=loader(val, batch_size=100, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


case("wine_rating_long_targets", "targets",
     "The continuous ratings are stored with torch.tensor(y, dtype=torch.long) in the Dataset, which truncates 3.7 to "
     "3, so the regressor is trained on floor(rating) and is biased half a point low; keep the targets float32.",
     r"torch\.long|int64|LongTensor|integer (dtype|type|targets|tensor)|\btrunc\w*|floor|"
     r"(fractional|decimal) part|cast\w* to int|(targets|labels) are (all )?(whole|integer)",
     )(wine_rating_long_targets)
fix("wine_rating_long_targets", fixed_of(wine_rating_long_targets),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", steps=250, higher=False)


# --- 4. unknown multi-label entries marked -1 and fed to BCE ----------------------------------------------------------
def _tagged(s):
    g = gen(s)
    x = torch.randn(1500, 20, generator=g)
    w = torch.randn(20, 6, generator=g) / 20 ** 0.5
    y = (x @ w > 0.0).float()
    yt = y[:1200].clone()
    yt[torch.rand(yt.shape, generator=g) < 0.5] = -1.0               # "unknown", Keras mask_value style
    return (x[:1200], yt), (x[1200:], y[1200:])


def photo_tags_unknown_minus_one(fixed: bool = False):
    seed(0)
    (xt, yt), (xv, yv) = _tagged(91)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 6))
    if fixed:
        def loss_fn(model, batch):
            x, y = batch
            known = (y >= 0).float()
            return F.binary_cross_entropy_with_logits(model(x), y.clamp(min=0), weight=known, reduction="sum") \
                / known.sum().clamp(min=1)
    else:
        loss_fn = nn.BCEWithLogitsLoss()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), batch_size=40),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


case("photo_tags_unknown_minus_one", "targets",
     "Half the multi-label targets are unknown and marked -1, but they go straight into BCEWithLogitsLoss with no "
     "mask: a -1 target is treated as a (negative) probability whose loss keeps falling as the logit goes to minus "
     "infinity, so every tag is pushed to 'absent'; mask the -1 entries out of the loss (weight=(y >= 0)).",
     r"(?<![\w(])-1(?![\d)])|minus one|(unknown|missing|unlabell?ed) (labels?|targets?|entries)|mask\w* (out )?(the )?(unknown|missing|"
     r"-1)|weight\s*=\s*\(?y\s*>=?\s*0|(targets?|labels?) (values )?(are )?(outside|out of|not in) \[?0, ?1",
     )(photo_tags_unknown_minus_one)
fix("photo_tags_unknown_minus_one", fixed_of(photo_tags_unknown_minus_one),
    acc_of(lambda m, b: ((m(b[0]) > 0).long(), b[1].long())), "val tag accuracy", steps=250)


# --- 5. class weights proportional to frequency, not inverse ----------------------------------------------------------
def _imbalanced(s):
    g = gen(s)
    x = torch.randn(30000, 10, generator=g)
    w = torch.randn(10, 3, generator=g)
    y = (x @ w + torch.tensor([2.6, 0.0, -1.4])).argmax(1)
    train = (x[:1500], y[:1500])
    rest_x, rest_y = x[1500:], y[1500:]
    idx = torch.cat([torch.nonzero(rest_y == c)[:200, 0] for c in range(3)])
    return train, (rest_x[idx], rest_y[idx])


def churn_class_weights_inverted(fixed: bool = False):
    seed(0)
    (xt, yt), (xv, yv) = _imbalanced(101)
    counts = torch.bincount(yt, minlength=3).float()
    freq = counts / counts.sum()
    weights = 1.0 / (3 * freq) if fixed else freq      # meant "balanced" weights
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), batch_size=50),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(weight=weights), max_steps=300)


def _balanced_acc(model, kw):
    with torch.no_grad():
        model.eval()
        xs, ys = zip(*kw["val_loader"])
        pred, y = model(torch.cat(xs)).argmax(-1), torch.cat(ys)
        model.train()
    return sum(((pred == c) & (y == c)).sum().item() / max((y == c).sum().item(), 1) for c in range(3)) / 3


case("churn_class_weights_inverted", "targets",
     "The CrossEntropyLoss class weights are set to the class frequencies (0.65 / 0.21 / 0.14) instead of their "
     "inverse, so the rarest class weighs almost 5x less than the common one and are almost never predicted; use "
     "weight = 1 / frequency.",
     r"(weights?|weighting).{0,60}(proportional to|equal to|set to|=) (the )?(class )?(frequenc|count|prior)|"
     r"inverse (class )?frequenc|1 ?/ ?(freq|frequency|count)|invert\w* (the )?(class )?weights|"
     r"(rare|minority|under-?represented) class\w* (get|gets|are given|receive)s? (the )?(smallest|lowest|less|"
     r"lower|tiny)|(favou?r|up-?weight)\w* the (majority|most frequent|common)",
     )(churn_class_weights_inverted)
fix("churn_class_weights_inverted", fixed_of(churn_class_weights_inverted), _balanced_acc, "val balanced accuracy",
    steps=250)
