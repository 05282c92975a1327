"""Set i, targets: target encoding, ranges and conventions (6 broken cases)."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_i.registry import case, fix, gen, loader, seed, val_acc

# --------------------------------------------------------------------------------------------------------------------
# 1. Multi-label photo tagger with nn.MultiLabelMarginLoss fed the multi-hot 0/1 vectors: that loss reads its target
#    as a list of class INDICES (padded with -1), so [0, 1, 0, 0, 1, ...] means "classes 0 and 1" for every photo.
# --------------------------------------------------------------------------------------------------------------------
N_TAGS, TAG_D = 8, 24


def _tagged_photos(n: int, s: int):
    g = gen(300)
    w = torch.randn(TAG_D, N_TAGS, generator=g)
    g = gen(s)
    x = torch.randn(n, TAG_D, generator=g)
    score = x @ w / TAG_D ** 0.5
    multi_hot = (score > 0.9).long()
    multi_hot[torch.arange(n), score.argmax(1)] = 1      # every photo has at least one tag
    return x, multi_hot


def to_index_targets(multi_hot: torch.Tensor) -> torch.Tensor:
    """MultiLabelMarginLoss's format: the positive class ids first, then -1."""
    out = torch.full_like(multi_hot, -1)
    for i, row in enumerate(multi_hot):
        ids = row.nonzero().flatten()
        out[i, :len(ids)] = ids
    return out


class TaggedPhotos(Dataset):
    def __init__(self, n: int, s: int, index_targets: bool):
        self.x, multi_hot = _tagged_photos(n, s)
        self.y = to_index_targets(multi_hot) if index_targets else multi_hot

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


@torch.no_grad()
def precision_at_1(model, kw):
    x, multi_hot = _tagged_photos(600, 2)
    model.eval()
    top = model(x).argmax(1)
    model.train()
    return multi_hot[torch.arange(len(x)), top].float().mean().item()


@case("photo_tags_multi_hot_into_multilabel_margin_loss", "targets",
      bug="the multi-label photo tagger is trained with nn.MultiLabelMarginLoss on its multi-hot 0/1 tag vectors, "
          "but that loss reads the target as a list of class indices padded with -1: a row [0, 1, 0, 0, 1, ...] "
          "means 'classes 0 and 1', so every photo is trained as tagged 0 and 1 and nothing else (the index format "
          "or BCEWithLogitsLoss on the multi-hot vectors was needed)",
      cause_pattern=r"MultiLabelMarginLoss|multi.?label.?margin|(list|format) of (class )?indices|"
                    r"class indices[^.]*(-1|padded)|index (format|list|targets)|indices[^.]*(padded|-1)|"
                    r"padded with -1|multi.?hot|0/1 (vector|target|label)|BCEWithLogits\w*[^.]*multi|"
                    r"multi\w*[^.]*BCEWithLogits|binary_cross_entropy\w*[^.]*multi")
def photo_tags_multi_hot_into_multilabel_margin_loss(index_targets=False):
    seed(0)
    train = TaggedPhotos(1500, 1, index_targets)
    val = TaggedPhotos(400, 2, index_targets)
    model = nn.Sequential(nn.Linear(TAG_D, 64), nn.ReLU(), nn.Linear(64, N_TAGS))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 200, shuffle=False),
                loss_fn=nn.MultiLabelMarginLoss())


def _margin_fact():
    logits = torch.zeros(1, 4, requires_grad=True)
    nn.MultiLabelMarginLoss()(logits, torch.tensor([[0, 0, 1, 1]])).backward()
    print(f"  MultiLabelMarginLoss with multi-hot target [0, 0, 1, 1] (tags 2 and 3): gradient "
          f"{logits.grad.flatten().tolist()} (pushes classes 0 and 1 up)")


fix("photo_tags_multi_hot_into_multilabel_margin_loss",
    partial(photo_tags_multi_hot_into_multilabel_margin_loss, index_targets=True), precision_at_1,
    "val precision@1", _margin_fact)


# --------------------------------------------------------------------------------------------------------------------
# 2. Wind direction regressed as (sin, cos) targets, but the directions are in degrees and torch.sin/cos take
#    radians: sin(270) is sin of 270 radians, so the targets are a wildly oscillating function of the direction.
# --------------------------------------------------------------------------------------------------------------------
def _wind(n: int, s: int, radians: bool):
    g = gen(400)
    mix = torch.randn(2, 10, generator=g)
    g = gen(s)
    deg = 360 * torch.rand(n, generator=g)
    rad = torch.deg2rad(deg)
    x = torch.stack([torch.cos(rad), torch.sin(rad)], 1) @ mix + 0.05 * torch.randn(n, 10, generator=g)
    angle = torch.deg2rad(deg) if radians else deg
    return x, torch.stack([torch.sin(angle), torch.cos(angle)], 1), deg


@torch.no_grad()
def wind_angular_error(model, kw):
    x, _, deg = _wind(600, 2, True)
    model.eval()
    out = model(x)
    model.train()
    pred = torch.rad2deg(torch.atan2(out[:, 0], out[:, 1])) % 360
    diff = (pred - deg).abs() % 360
    return torch.minimum(diff, 360 - diff).mean().item()


@case("wind_direction_degrees_into_torch_sin_cos", "targets",
      bug="the wind direction is encoded as targets (sin(d), cos(d)) with d in degrees, but torch.sin/torch.cos "
          "take radians: the targets are sin and cos of 0-360 radians, a function that wraps around 57 times over "
          "the compass, so neighbouring directions get unrelated targets (torch.deg2rad(d) was needed)",
      cause_pattern=r"degree|radian|deg2rad|math\.radians|torch\.sin|torch\.cos|\bsin\b|\bcos\b|angle[^.]*units?|"
                    r"units?[^.]*angle")
def wind_direction_degrees_into_torch_sin_cos(radians=False):
    seed(0)
    x, y, _ = _wind(2000, 1, radians)
    xv, yv, _ = _wind(500, 2, radians)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 250, False),
                loss_fn=nn.MSELoss())


def _wind_fact():
    d = torch.tensor([90.0, 91.0, 92.0])
    print(f"  torch.sin of directions 90, 91, 92 (degrees): {[round(v, 2) for v in torch.sin(d).tolist()]}; "
          f"in radians: {[round(v, 2) for v in torch.sin(torch.deg2rad(d)).tolist()]}")


fix("wind_direction_degrees_into_torch_sin_cos", partial(wind_direction_degrees_into_torch_sin_cos, radians=True),
    wind_angular_error, "val mean angular error (deg)", _wind_fact, higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 3. Daily unit sales regressed in log space with torch.log(units): over a quarter of the store-days sold nothing,
#    log(0) = -inf, and the MSE against -inf targets is inf from the first batch (torch.log1p was meant).
# --------------------------------------------------------------------------------------------------------------------
WIN = 14


def _sales(n_series: int, s: int, log1p: bool):
    g = gen(s)
    days = 120
    base = torch.exp(torch.empty(n_series).uniform_(math.log(0.3), math.log(8.0), generator=g))
    week = 1 + 0.6 * torch.sin(2 * math.pi * torch.arange(days) / 7)
    counts = torch.poisson(base[:, None] * week[None, :], generator=g)
    xs, ys = [], []
    for t in range(WIN, days):
        dow = F.one_hot(torch.full((n_series,), t % 7), 7).float()
        xs.append(torch.cat([torch.log1p(counts[:, t - WIN:t]), dow], 1))
        ys.append(counts[:, t])
    x, units = torch.cat(xs), torch.cat(ys)
    y = torch.log1p(units) if log1p else torch.log(units)
    return x, y, units


class SalesMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(WIN + 7, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@torch.no_grad()
def sales_mae(model, kw):
    x, _, units = _sales(25, 2, True)
    model.eval()
    pred = torch.expm1(model(x)).clamp(min=0)
    model.train()
    return (pred - units).abs().mean().item()


@case("store_sales_log_targets_with_zero_sale_days", "targets",
      bug="the next-day unit sales are regressed in log space with torch.log(units), but more than a quarter of "
          "the store-days sold nothing: log(0) = -inf, so the MSE against those targets is infinite from the first "
          "batch and the weights turn NaN (torch.log1p / expm1 was meant)",
      cause_pattern=r"log1p|log\(0\)|log of (zero|0)|-inf|-∞|(infinite|non-?finite|inf) (targets?|labels?|"
                    r"values? in the targets?)|(targets?|labels?)[^.]*(-?inf\b|infinite|non-?finite)|zero (sales|"
                    r"counts?)")
def store_sales_log_targets_with_zero_sale_days(log1p=False):
    seed(0)
    x, y, _ = _sales(60, 1, log1p)
    xv, yv, _ = _sales(25, 2, log1p)
    model = SalesMLP()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 500, False),
                loss_fn=nn.MSELoss())


def _sales_fact():
    _, y, units = _sales(60, 1, False)
    print(f"  {(units == 0).float().mean().item():.0%} of the training targets are zero sales; torch.log gives "
          f"{y.min().item()} for them")


fix("store_sales_log_targets_with_zero_sale_days", partial(store_sales_log_targets_with_zero_sale_days, log1p=True),
    sales_mae, "val MAE (units)", _sales_fact, higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 4. Tiny BERT masked LM whose collate ignores the wrong positions: labels[mask] = -100 keeps the loss on the visible
#    tokens (which the model reads and copies) and ignores exactly the [MASK] positions it should predict.
# --------------------------------------------------------------------------------------------------------------------
MLM_VOCAB, MLM_T, PAD, CLS, MASK = 40, 16, 0, 1, 3


def _mlm_corpus(n: int, s: int) -> torch.Tensor:
    """[CLS] + a random 4-token motif repeated: a masked token can be read off its other occurrences."""
    g = gen(s)
    motif = torch.randint(4, MLM_VOCAB, (n, 4), generator=g)
    return torch.cat([torch.full((n, 1), CLS), motif.repeat(1, MLM_T // 4)], 1)


def mask_tokens(ids: torch.Tensor, g: torch.Generator):
    mask = torch.rand(ids.shape, generator=g) < 0.15
    mask[:, 0] = False
    mask[torch.arange(len(ids)), torch.randint(1, ids.shape[1], (len(ids),), generator=g)] = True
    return ids.masked_fill(mask, MASK), mask


class MLMCollator:
    def __init__(self, s: int, ignore_unmasked: bool):
        self.g, self.ignore_unmasked = gen(s), ignore_unmasked

    def __call__(self, rows):
        ids = torch.stack(rows)
        inputs, mask = mask_tokens(ids, self.g)
        labels = ids.clone()
        if self.ignore_unmasked:
            labels[~mask] = -100
        else:
            labels[mask] = -100            # -100 where the token was masked out
        return {"input_ids": inputs, "attention_mask": torch.ones_like(ids), "labels": labels}


def tiny_bert_config(**kw):
    from transformers import BertConfig
    base = dict(vocab_size=MLM_VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=96, max_position_embeddings=40, type_vocab_size=2, pad_token_id=PAD)
    base.update(kw)
    return BertConfig(**base)


@torch.no_grad()
def masked_token_accuracy(model, kw):
    ids = _mlm_corpus(300, 2)
    inputs, mask = mask_tokens(ids, gen(9))
    model.eval()
    pred = model(input_ids=inputs, attention_mask=torch.ones_like(ids)).logits.argmax(-1)
    model.train()
    return (pred[mask] == ids[mask]).float().mean().item()


@case("bert_mlm_labels_ignored_on_the_masked_positions", "targets",
      bug="the MLM collate sets labels[mask] = -100, i.e. ignores exactly the [MASK] positions and keeps the loss on "
          "the visible tokens, which BertForMaskedLM reads in its input and only has to copy: it never learns to "
          "fill in a masked token (labels[~mask] = -100 was meant)",
      cause_pattern=r"\[MASK\]|masked (positions|tokens)|unmasked|visible tokens|(copy|copies|copying) (the|"
                    r"its) input|labels?\[~?mask\]|invert\w*[^.]*mask|mask[^.]*invert|-100[^.]*mask|mask[^.]*-100|"
                    r"ignore_index[^.]*mask|(labels?|targets?)[^.]*(equal|same as|identical to|"
                    r"copy of) (the )?inputs?")
def bert_mlm_labels_ignored_on_the_masked_positions(ignore_unmasked=False):
    from transformers import BertForMaskedLM
    seed(0)
    model = BertForMaskedLM(tiny_bert_config())
    train, val = list(_mlm_corpus(1200, 1)), list(_mlm_corpus(300, 2))
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32, collate_fn=MLMCollator(5, ignore_unmasked)),
                val_loader=loader(val, 100, shuffle=False, collate_fn=MLMCollator(6, ignore_unmasked)), loss_fn=None)


def _mlm_fact():
    batch = MLMCollator(5, False)(list(_mlm_corpus(4, 1)))
    masked = batch["input_ids"] == MASK
    print(f"  labels at [MASK] positions: {(batch['labels'][masked] == -100).float().mean().item():.0%} are -100; "
          f"labels on visible tokens equal the input: "
          f"{(batch['labels'][~masked] == batch['input_ids'][~masked]).float().mean().item():.0%}")


fix("bert_mlm_labels_ignored_on_the_masked_positions",
    partial(bert_mlm_labels_ignored_on_the_masked_positions, ignore_unmasked=True), masked_token_accuracy,
    "val masked-token accuracy", _mlm_fact)


# --------------------------------------------------------------------------------------------------------------------
# 5. Mixup with the label weights swapped: images mixed lam * x1 + (1 - lam) * x2, labels (1 - lam) * y1 + lam * y2.
#    With lam ~ Beta(0.4, 0.4) most mixes are dominated by one image, whose label then gets the small weight.
# --------------------------------------------------------------------------------------------------------------------
def _bars(n: int, s: int):
    """1x16x16 images: a horizontal, vertical, diagonal or anti-diagonal bar at a random offset, plus noise."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.4 * torch.randn(n, 1, 16, 16, generator=g)
    r = torch.arange(16)
    for i in range(n):
        o = int(torch.randint(3, 13, (1,), generator=g))
        if y[i] == 0:
            x[i, 0, o, 2:14] += 1.5
        elif y[i] == 1:
            x[i, 0, 2:14, o] += 1.5
        elif y[i] == 2:
            k = o - 8
            idx = r[(r + k >= 0) & (r + k < 16)]
            x[i, 0, idx, idx + k] += 1.5
        else:
            k = o - 8
            idx = r[(15 - r + k >= 0) & (15 - r + k < 16)]
            x[i, 0, idx, 15 - idx + k] += 1.5
    return x, y


def small_cnn(classes: int = 4, c: int = 1):
    return nn.Sequential(nn.Conv2d(c, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, classes))


class MixupCollate:
    def __init__(self, s: int, label_weight_first: bool, alpha: float = 0.4):
        self.rng, self.alpha, self.first = np.random.default_rng(s), alpha, label_weight_first
        self.g = gen(s)

    def __call__(self, rows):
        x = torch.stack([r[0] for r in rows])
        y = F.one_hot(torch.stack([r[1] for r in rows]), 4).float()
        lam = float(self.rng.beta(self.alpha, self.alpha))
        perm = torch.randperm(len(x), generator=self.g)
        x = lam * x + (1 - lam) * x[perm]
        if self.first:
            y = lam * y + (1 - lam) * y[perm]
        else:
            y = (1 - lam) * y + lam * y[perm]
        return x, y


@case("bars_cnn_mixup_label_weights_swapped", "targets",
      bug="the mixup collate mixes the images as lam * x1 + (1 - lam) * x2 but the one-hot labels as "
          "(1 - lam) * y1 + lam * y2: the weights are swapped, and with lam ~ Beta(0.4, 0.4) most mixes are "
          "dominated by one image whose label gets the small weight, so the soft targets mostly name the faint "
          "partner image's class",
      cause_pattern=r"mixup|mix.?up|lam\b|lambda[^.]*(label|target|weight)|(label|target)s?[^.]*(weight|"
                    r"mix\w*)[^.]*(swap|revers|invert|mismatch)|(swap|revers|invert)\w*[^.]*(weight|lam)")
def bars_cnn_mixup_label_weights_swapped(label_weight_first=False):
    seed(0)
    train = TensorDataset(*_bars(1600, 1))
    val = TensorDataset(*_bars(400, 2))
    model = small_cnn()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32, collate_fn=MixupCollate(3, label_weight_first)),
                val_loader=loader(val, 200, shuffle=False), loss_fn=nn.CrossEntropyLoss())


def _mixup_fact():
    lams = np.random.default_rng(0).beta(0.4, 0.4, 10000)
    print(f"  lam ~ Beta(0.4, 0.4): {(np.abs(lams - 0.5) > 0.3).mean():.0%} of the batches have one image at "
          f"> 80% weight; its label then gets < 20% of the target mass")


fix("bars_cnn_mixup_label_weights_swapped", partial(bars_cnn_mixup_label_weights_swapped, label_weight_first=True),
    val_acc, "clean val accuracy", _mixup_fact)


# --------------------------------------------------------------------------------------------------------------------
# 6. P90 delivery-time model with the quantile given in percent: pinball(q=90) is max(90 e, 89 e) for e = y - pred,
#    which is negative and unbounded below for every over-prediction: the loss falls forever as predictions grow.
# --------------------------------------------------------------------------------------------------------------------
def _deliveries(n: int, s: int):
    g = gen(500)
    w = torch.randn(8, generator=g) / 8 ** 0.5
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    scale = 0.5 + 0.4 * torch.sigmoid(x[:, 0])
    y = 1.5 * torch.tanh(x @ w) + scale * torch.randn(n, generator=g)
    return x, y


class Pinball(nn.Module):
    def __init__(self, q: float):
        super().__init__()
        self.q = q

    def forward(self, pred, y):
        err = y - pred
        return torch.maximum(self.q * err, (self.q - 1) * err).mean()


class DeliveryMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@torch.no_grad()
def pinball_p90(model, kw):
    x, y = _deliveries(800, 2)
    model.eval()
    value = Pinball(0.9)(model(x), y).item()
    model.train()
    return value


@case("delivery_p90_pinball_quantile_in_percent", "targets",
      bug="the P90 delivery-time model's pinball loss gets its quantile as q=90 (percent, from the 'P90' name) "
          "instead of 0.9: max(q * e, (q - 1) * e) is then max(90 e, 89 e), which for every over-prediction "
          "(e < 0) is 89 e, negative and unbounded below, so the loss falls without limit as the predictions grow",
      cause_pattern=r"quantile|pinball|percent\w*[^.]*(quantile|\bq\b)|\bq\s*=\s*90|unbounded|(loss|"
                    r"objective) (is|was|became|becomes|goes|went|turns?|dropped|drops|falls?)[^.]*(negative|"
                    r"below zero)|negative (loss|values? of the loss)|loss[^.]*< ?0\b")
def delivery_p90_pinball_quantile_in_percent(q=90):
    seed(0)
    train = TensorDataset(*_deliveries(2000, 1))
    val = TensorDataset(*_deliveries(500, 2))
    model = DeliveryMLP()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 32), val_loader=loader(val, 250, shuffle=False), loss_fn=Pinball(q))


def _pinball_fact():
    y = torch.zeros(3)
    for pred in (0.0, 10.0, 100.0):
        print(f"  pinball(q=90) with every prediction {pred:5.0f} above the target: "
              f"{Pinball(90)(torch.full((3,), pred), y).item():.0f}")


fix("delivery_p90_pinball_quantile_in_percent", partial(delivery_p90_pinball_quantile_in_percent, q=0.9),
    pinball_p90, "val pinball loss at q=0.9", _pinball_fact, higher=False)
