"""Mechanics: how the vision model is normalised, regularised, scheduled and stored while it trains."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_u.registry import acc_of, case, fix, fixed_of, loader, rng, seed

cls_acc = acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))


# --- 1. Keras BatchNormalization(momentum=0.99) ported verbatim --------------------------------------------------------

def _exposures(n, s):
    """Night / dusk / day camera-trap frames: the class is the absolute exposure level, frames vary a lot."""
    r = rng(s)
    y = r.integers(0, 3, n)
    level = np.array([0.15, 0.45, 0.75])[y] + r.normal(0, 0.05, n)
    img = level[:, None, None, None] + r.normal(0, 0.25, (n, 1, 12, 12))
    return torch.from_numpy(img.astype(np.float32)), torch.from_numpy(y)


class TrapNet(nn.Module):
    def __init__(self, bn_momentum):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16, momentum=bn_momentum), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


@case("trap_batchnorm_keras_momentum", "mechanics",
      bug="The camera-trap CNN was ported from Keras with BatchNorm2d(16, momentum=0.99), but PyTorch's momentum is the "
          "weight of the new batch (Keras 0.99 = PyTorch 0.01): the running mean/var become the statistics of the last "
          "small batch alone, so the eval-mode model normalises with a noisy, arbitrary exposure offset.",
      cause_pattern=r"momentum ?= ?0?\.99|BatchNorm\w*.{0,80}momentum|momentum.{0,80}(running (stats|mean|var)|"
                    r"BatchNorm|1 ?- ?momentum|keras|tensorflow|convention)"
                    r"|running (stats|statistics|mean).{0,60}(last|single|one) (mini-?)?batch")
def trap_bn(fixed=False):
    seed(0)
    xtr, ytr = _exposures(1200, 31)
    xva, yva = _exposures(300, 32)
    model = TrapNet(0.01 if fixed else 0.99)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xtr, ytr), 4),
                val_loader=loader(TensorDataset(xva, yva), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("trap_batchnorm_keras_momentum", fixed_of(trap_bn), cls_acc, "val accuracy (eval mode)")


# --- 2. LambdaLR whose lambda returns the learning rate, not a factor ---------------------------------------------------

def _land_cover(n, s):
    tint = rng(99).uniform(0.35, 0.65, (5, 4))          # each class's mean reflectance in the 4 bands
    r = rng(s)
    y = r.integers(0, 5, n)
    img = tint[y][:, :, None, None] + r.normal(0, 0.9, (n, 4, 12, 12))
    return torch.from_numpy(img.astype(np.float32)), torch.from_numpy(y)


def _small_cnn(cin, n_out):
    return nn.Sequential(nn.Conv2d(cin, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, n_out))


BASE_LR, WARMUP = 3e-3, 30


@case("landcover_lambdalr_returns_lr", "mechanics",
      bug="The warm-up schedule is LambdaLR(optimizer, lambda step: 3e-3 * min(1, (step + 1) / 30)), but LambdaLR "
          "multiplies the optimizer's base lr by what the lambda returns: the effective lr is 3e-3 * 3e-3 = 9e-6 and "
          "the land-cover CNN barely moves.",
      cause_pattern=r"LambdaLR.{0,100}(factor|multipli|times the (base|initial))|lr_lambda.{0,80}(factor|multipli|"
                    r"absolute)|(multiplied|scaled|applied) twice|base (lr|learning rate).{0,30}(times|multiplied|\*)"
                    r".{0,40}(lambda|again)")
def landcover_lambda(fixed=False):
    seed(0)
    xtr, ytr = _land_cover(1000, 33)
    xva, yva = _land_cover(300, 34)
    model = _small_cnn(4, 5)
    optimizer = torch.optim.Adam(model.parameters(), lr=BASE_LR)
    if fixed:
        schedule = lambda step: min(1.0, (step + 1) / WARMUP)  # noqa: E731
    else:
        schedule = lambda step: BASE_LR * min(1.0, (step + 1) / WARMUP)  # noqa: E731
    return dict(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, schedule),
                train_loader=loader(TensorDataset(xtr, ytr), 32),
                val_loader=loader(TensorDataset(xva, yva), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("landcover_lambdalr_returns_lr", fixed_of(landcover_lambda), cls_acc, "val accuracy")


# --- 3. the whole model cast to bfloat16 (weights and Adam state included) -----------------------------------------------

def bf16_loss(model, batch):
    x, y = batch
    logits = model(x.to(next(model.parameters()).dtype))
    return F.cross_entropy(logits.float(), y)


@case("landcover_weights_cast_to_bf16", "mechanics",
      bug="'bf16 training' is done with model.to(torch.bfloat16): the weights and Adam's states live in bfloat16, "
          "whose 8-bit mantissa cannot represent an update of ~lr=2e-4 on weights of size ~0.1-0.5, so most steps "
          "round back to the old weight and the CNN hardly trains (no fp32 master weights, no autocast).",
      cause_pattern=r"bfloat16.{0,80}(weights|param|master|optimi[sz]er|updates?)|(weights|param\w*).{0,60}"
                    r"(stored|kept|held|are|live) in (bf16|bfloat16)|master (weights|copy)|fp32 (master|weights|copy)"
                    r"|(updates?|steps?).{0,60}(round|lost|swallow|below).{0,60}(bf16|bfloat16|precision|ulp|spacing)"
                    r"|model\.(to\(torch\.bfloat16\)|bfloat16\(\))")
def landcover_bf16(fixed=False):
    seed(0)
    xtr, ytr = _land_cover(1000, 35)
    xva, yva = _land_cover(300, 36)
    model = _small_cnn(4, 5)
    if not fixed:
        model = model.to(torch.bfloat16)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-4),
                train_loader=loader(TensorDataset(xtr, ytr), 32),
                val_loader=loader(TensorDataset(xva, yva), 100, shuffle=False),
                loss_fn=bf16_loss, precision="bf16", max_steps=300)


fix("landcover_weights_cast_to_bf16", fixed_of(landcover_bf16),
    acc_of(lambda m, b: (m(b[0].to(next(m.parameters()).dtype)).argmax(-1), b[1])), "val accuracy")


# --- 4. BatchNorm on micro-batches of 2 under gradient accumulation -------------------------------------------------------

@case("trap_batchnorm_microbatch_accumulation", "mechanics",
      bug="To 'get batch 32 on a small GPU' the exposure classifier trains with batch_size=2 and accumulation_steps=16, "
          "but its BatchNorm2d normalises each micro-batch of 2 frames on its own: the absolute exposure level that "
          "defines the class is subtracted away in training, and eval-mode running stats see a different model.",
      cause_pattern=r"BatchNorm\w*.{0,120}(micro-?batch|batch (size|of) ?[12]\b|accumulat|small batch)"
                    r"|accumulat\w*.{0,100}BatchNorm|(batch (statistics|stats)).{0,80}(micro|small|2 (samples|frames|"
                    r"images)|accumulat)|GroupNorm")
def trap_microbatch(fixed=False):
    seed(0)
    xtr, ytr = _exposures(1200, 37)
    xva, yva = _exposures(300, 38)
    model = TrapNet(0.1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xtr, ytr), 32 if fixed else 2),
                val_loader=loader(TensorDataset(xva, yva), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), accumulation_steps=1 if fixed else 16, max_steps=120)


fix("trap_batchnorm_microbatch_accumulation", fixed_of(trap_microbatch), cls_acc, "val accuracy (eval mode)",
    steps=120)


# --- 5. TF keep_prob=0.9 ported as nn.Dropout(0.9) ----------------------------------------------------------------------

class DefectHead(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(4, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                      nn.Flatten())
        self.drop = nn.Dropout(p)
        self.fc = nn.Linear(64, 5)

    def forward(self, x):
        return self.fc(self.drop(self.features(x)))


@case("landcover_dropout_keep_prob", "mechanics",
      bug="The head was ported from TF1 where slim.dropout(keep_prob=0.9) keeps 90% of units; written as "
          "nn.Dropout(0.9) it drops 90% (PyTorch's p is the drop probability) and scales the survivors by 10, so the "
          "classifier trains on a few noisy features per step.",
      cause_pattern=r"keep_prob|Dropout\(0?\.9\)|dropout.{0,60}(p ?= ?0?\.9|0\.9|90 ?%)"
                    r"|(drop|keep) probability.{0,60}(confus|invert|revers|1 ?- ?p)|rate ?= ?1 ?- ?keep")
def landcover_dropout(fixed=False):
    seed(0)
    xtr, ytr = _land_cover(1000, 39)
    xva, yva = _land_cover(300, 40)
    model = DefectHead(0.1 if fixed else 0.9)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(xtr, ytr), 32),
                val_loader=loader(TensorDataset(xva, yva), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("landcover_dropout_keep_prob", fixed_of(landcover_dropout), cls_acc, "val accuracy")
