"""Targets: what the loss compares against is not what the user meant (scale, encoding, problem type, weights)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_z.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    model_device,
    plain_acc,
    seed,
    standardize,
    to_dev,
)

# --------------------------------------------------------------------------------------------------------------
# 1. Binary segmentation of cells; masks are read from PNGs and keep their 0/255 values, fed straight into
#    BCEWithLogitsLoss as the target.


class CellMasks(Dataset):
    def __init__(self, n, s, fixed=False):
        g = gen(s)
        self.img = 0.4 * torch.randn(n, 1, 16, 16, generator=g)
        self.mask = torch.zeros(n, 1, 16, 16, dtype=torch.uint8)
        yy, xx = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
        for i in range(n):
            cy, cx = torch.randint(3, 13, (2,), generator=g).tolist()
            r = 1.5 + 2.5 * torch.rand(1, generator=g).item()
            blob = ((yy - cy) ** 2 + (xx - cx) ** 2) <= r * r
            self.img[i, 0][blob] += 1.0
            self.mask[i, 0][blob] = 255  # as stored in the PNG
        self.fixed = fixed

    def __len__(self):
        return len(self.img)

    def __getitem__(self, i):
        m = self.mask[i].float()
        return self.img[i], (m / 255.0 if self.fixed else m)


def iou(model, kw):
    def fn(m, b):
        x, y = to_dev(m, *b)
        p = m(x) > 0
        t = y > 0
        return (p & t).sum().item(), (p | t).sum().item()
    return mean_over(model, kw["val_loader"], fn)


def _seg_net():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 1, 1))


@case("bce_mask_values_0_255", "targets",
      "The segmentation masks keep their PNG values 0/255 and go straight into BCEWithLogitsLoss as targets; "
      "binary cross-entropy needs targets in [0, 1], and with 255 the loss is unbounded below and pushes every "
      "logit up (divide the mask by 255).",
      r"255|targets? (outside|not in|must be in|should be in|in the range)|\[0, ?1\]|"
      r"(binary|0/1|0 and 1) (mask|target)|divide.{0,20}mask|mask.{0,40}(normali[sz]|scale)|loss.{0,30}negative")
def bce_mask_values_0_255(fixed: bool = False):
    seed(0)
    model = _seg_net()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(CellMasks(800, 1, fixed), 16), val_loader=loader(CellMasks(200, 2, fixed), 100, False),
                loss_fn=nn.BCEWithLogitsLoss())


fix("bce_mask_values_0_255", fixed_of(bce_mask_values_0_255), iou, "val IoU")

# --------------------------------------------------------------------------------------------------------------
# 2. Review sentiment with a tiny BERT built from a config: num_labels=1 "because it is binary". Transformers
#    then treats the task as regression (MSELoss on one logit; the labels were cast to float after the dtype
#    error), and the usual argmax evaluation always answers class 0.


def _reviews(n, s, vocab=120, length=16):
    g = gen(s)
    sentiment = torch.randn(vocab, generator=gen(77))
    sentiment = sentiment - sentiment[5:].mean()
    ids = torch.randint(5, vocab, (n, length), generator=g)
    y = (sentiment[ids].sum(1) > 0).long()
    ids[:, 0] = 1  # [CLS]
    return ids, y


class ReviewBatches(Dataset):
    def __init__(self, ids, y, float_labels):
        self.ids, self.y, self.float_labels = ids, y, float_labels

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        label = self.y[i].float() if self.float_labels else self.y[i]
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": label}


def _bert(num_labels):
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32, num_labels=num_labels,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(cfg)


def hf_argmax_acc(model, kw):
    def fwd(m, b):
        dev = model_device(m)
        out = m(input_ids=b["input_ids"].to(dev), attention_mask=b["attention_mask"].to(dev))
        return out.logits.argmax(-1), b["labels"].long()
    return acc_of(fwd)(model, kw)


@case("hf_num_labels_one_for_binary", "targets",
      "BertForSequenceClassification is built with num_labels=1 for a two-class task: with one label Transformers "
      "treats it as regression (MSELoss on a single logit, labels cast to float), and argmax over that one logit "
      "always predicts class 0; binary classification needs num_labels=2 with integer labels.",
      r"num_labels|problem_type|regression.{0,60}(MSE|one logit|single logit)|(MSELoss|mean.squared).{0,80}"
      r"(classif|binary|logit)|single (output|logit)|one (output|logit)|"
      r"argmax.{0,40}(one|single|1)")
def hf_num_labels_one_for_binary(fixed: bool = False):
    seed(0)
    ids, y = _reviews(1600, 3)
    model = _bert(2 if fixed else 1)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                train_loader=loader(ReviewBatches(ids[:1300], y[:1300], not fixed), 32),
                val_loader=loader(ReviewBatches(ids[1300:], y[1300:], not fixed), 150, shuffle=False),
                loss_fn=None)


fix("hf_num_labels_one_for_binary", fixed_of(hf_num_labels_one_for_binary), hf_argmax_acc, "val accuracy (argmax)")

# --------------------------------------------------------------------------------------------------------------
# 3. House prices in dollars (1e5..6e5) regressed with MSELoss straight from a zero-initialised-ish output:
#    standardised features, raw targets.


class Houses(Dataset):
    def __init__(self, x, price, scale):
        self.x, self.price, self.scale = x, price, scale

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.price[i] / self.scale


def _houses(n, s=4):
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    price = 3.0e5 + 8.0e4 * (x[:, :4] @ torch.tensor([1.0, 0.6, -0.4, 0.3])) + 2.0e4 * torch.randn(n, generator=g)
    return standardize(x), price.clamp(min=5e4).unsqueeze(1)


def dollar_rmse(model, kw):
    scale = kw["val_loader"].dataset.scale

    def fn(m, b):
        x, y = to_dev(m, *b)
        return (((m(x) - y) * scale) ** 2).sum().item(), y.numel()
    return mean_over(model, kw["val_loader"], fn) ** 0.5


@case("unscaled_price_targets", "targets",
      "House prices around 3e5 dollars are regressed with MSELoss without scaling the target: the network's outputs "
      "start near 0 and Adam moves them by about lr per step, so after the run the predictions are still far below "
      "the prices (standardise or divide the target, e.g. by 1e5).",
      r"1e5|3e5|dollars?|house prices?|prices?.{0,60}(scale|normali[sz]|standardi[sz]|units|divid|magnitude)|"
      r"(scale|normali[sz]|standardi[sz]|divid).{0,60}price")
def unscaled_price_targets(fixed: bool = False):
    seed(0)
    x, price = _houses(1500)
    scale = 1e5 if fixed else 1.0
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(Houses(x[:1200], price[:1200], scale), 32),
                val_loader=loader(Houses(x[1200:], price[1200:], scale), 300, shuffle=False),
                loss_fn=nn.MSELoss())


fix("unscaled_price_targets", fixed_of(unscaled_price_targets), dollar_rmse, "val RMSE in dollars", higher=False)

# --------------------------------------------------------------------------------------------------------------
# 4. Movie genre tagging (several genres per film) trained with nn.CrossEntropyLoss on multi-hot float targets;
#    the tags are later read as sigmoid(logit) > 0.5.

GENRES = 6


def _genres(n, s=6):
    g = gen(s)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, GENRES, generator=gen(61))
    y = ((x @ w) / 20 ** 0.5 + 0.3 * torch.randn(n, GENRES, generator=g) > 0.2).float()
    return x, y


def label_acc(model, kw):
    def fn(m, b):
        x, y = to_dev(m, *b)
        return ((m(x) > 0).float() == y).sum().item(), y.numel()
    return mean_over(model, kw["val_loader"], fn)


@case("multilabel_with_crossentropy", "targets",
      "Multi-label genre targets (several 1s per row) are trained with nn.CrossEntropyLoss, whose softmax makes the "
      "genres compete for one unit of probability; the per-genre sigmoid > 0.5 read-out then has no meaning "
      "(multi-label needs BCEWithLogitsLoss).",
      r"multi-?label|multi-?hot|softmax.{0,60}(compet|mutually|exclusive|sum to)|"
      r"(several|multiple) (positive )?(labels|classes|genres|1s) per|CrossEntropyLoss.{0,80}(several|multiple|multi)")
def multilabel_with_crossentropy(fixed: bool = False):
    seed(0)
    x, y = _genres(2000)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, GENRES))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss())


fix("multilabel_with_crossentropy", fixed_of(multilabel_with_crossentropy), label_acc, "val per-genre accuracy")

# --------------------------------------------------------------------------------------------------------------
# 5. Support-ticket priority (80% low / 15% medium / 5% urgent): CrossEntropyLoss(weight=...) is given the
#    class frequencies instead of their inverse, which makes the imbalance worse.


def _tickets(n, s=8):
    g = gen(s)
    y = torch.multinomial(torch.tensor([0.80, 0.15, 0.05]), n, replacement=True, generator=g)
    centers = torch.tensor([[0.0, 0.0], [1.3, 0.4], [0.5, 1.5]])
    x = torch.cat([centers[y] + 0.8 * torch.randn(n, 2, generator=g), torch.randn(n, 6, generator=g)], 1)
    return x, y


def macro_recall(model, kw):
    dev = model_device(model)
    was = model.training
    model.eval()
    preds, ys = [], []
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            preds.append(model(x.to(dev)).argmax(-1).cpu())
            ys.append(y)
    model.train(was)
    p, y = torch.cat(preds), torch.cat(ys)
    return sum(((p == c) & (y == c)).sum().item() / max((y == c).sum().item(), 1) for c in range(3)) / 3


@case("class_weights_are_frequencies", "targets",
      "nn.CrossEntropyLoss(weight=...) gets the class frequencies (0.80, 0.15, 0.05) instead of their inverse, so "
      "the rare urgent class weighs 16 times less than the common one and is almost never predicted.",
      r"(inverse|invert|reciproc)\w*.{0,40}(frequenc|counts?)|weights?.{0,40}(are|=|equal|set to|proportional to|"
      r"given|gets?) (the )?(class )?(frequenc|counts?)|(frequenc|counts?) instead of|0\.80, 0\.15|"
      r"(rare|minority) class.{0,40}(weighs|weight|weighted) (less|least|lowest)")
def class_weights_are_frequencies(fixed: bool = False):
    seed(0)
    x, y = _tickets(3000)
    freq = torch.bincount(y[:2400], minlength=3).float() / 2400
    weight = (1.0 / freq) / (1.0 / freq).sum() * 3 if fixed else freq
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 300, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(weight=weight))


fix("class_weights_are_frequencies", fixed_of(class_weights_are_frequencies), macro_recall, "val macro recall")
_ = plain_acc
