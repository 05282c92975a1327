"""Set e, family 4: optimizer and step mechanics (hyperparameters, schedulers, loss reduction, what the loss
returns to the loop, optimizer hooks)."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_e.cases_shapes import BiGRUTagger, bar_orientations, tagging_corpus
from benchmarks.blind_preflight_e.cases_trained import BarNet
from benchmarks.blind_preflight_e.registry import case, loader, seed, teacher_classes, teacher_regression

FAMILY = "mechanics"


def bars(n=2500, s=0):
    x, y = bar_orientations(n, s=s)
    return (loader(TensorDataset(x[:2048], y[:2048]), 64),
            loader(TensorDataset(x[2048:], y[2048:]), 128, shuffle=False))


def regression_mlp(d=16):
    return nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def plain_cnn(classes=4):
    """A small CNN without normalisation layers (the MNIST example's layout)."""
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


def squeeze_mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x).squeeze(-1), y)


# --------------------------------------------------------------------------- 1. Adam betas swapped


@case("adam_betas_swapped_0999_09", FAMILY,
      "Adam is built with betas=(0.999, 0.9), the two coefficients swapped: the first moment averages the gradients "
      "of the last ~1000 steps while the second moment forgets within ~10, so each update keeps pushing along stale "
      "gradient directions, scaled by a noisy recent magnitude, and the regression oscillates instead of converging",
      r"\bbetas?\b|(momentum|first moment)[^.]*(0\.999|too (high|large|slow))")
def adam_betas_swapped_0999_09():
    seed(0)
    x, y = teacher_regression(3000, 16, s=31)
    model = regression_mlp()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.999, 0.9)),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=squeeze_mse, max_steps=2000)


# --------------------------------------------------------------------------- 2. StepLR sized in epochs, stepped per batch


@case("steplr_epoch_step_size_stepped_every_batch", FAMILY,
      "StepLR(step_size=10, gamma=0.1) was sized in epochs ('decay 10x every 10 epochs') but the scheduler is stepped "
      "after every optimizer step: the LR is divided by 10 every 10 batches, so after 60 of the run's 3200 steps it "
      "is 5e-8 and the CNN stops learning in its first epoch",
      r"step_size|gamma|per.?(epoch|batch|iteration|optimi[sz]er step)|every (batch|step|iteration)|(\blr\b|learning."
      r"?rate)[^.]*(decay|drop|falls?|vanish|shrink|tiny|negligible|reach(es)? (0|zero)|1e-\d|below|too (quickly|fast|"
      r"early|soon))|schedul")
def steplr_epoch_step_size_stepped_every_batch():
    seed(0)
    model = BarNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train, val = bars(s=32)
    return dict(model=model, optimizer=optimizer, train_loader=train, val_loader=val,
                scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.1),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3200)


# --------------------------------------------------------------------------- 3. LambdaLR returning an absolute LR


BASE_LR, WARMUP = 1e-3, 100


@case("lambdalr_returns_learning_rate_not_factor", FAMILY,
      "the warmup is LambdaLR(opt, lambda s: BASE_LR * min(1, (s + 1) / WARMUP)) with the optimizer at lr=BASE_LR: "
      "LambdaLR multiplies the base LR by what the lambda returns, so the LR is BASE_LR**2 = 1e-6 after warmup, a "
      "thousand times smaller than intended, and the MLP barely moves",
      r"lr_lambda|LambdaLR|multipl|factor|(\blr\b|learning.?rate)[^.]*(tiny|small|1e-0?6|e-0?7|squared|1000|never reach"
      r"|below)")
def lambdalr_returns_learning_rate_not_factor():
    seed(0)
    x, y = teacher_classes(3000, 20, 4, s=33)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=BASE_LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: BASE_LR * min(1.0, (s + 1) / WARMUP))
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 4. .item() on the data term, tensor L2 term


def ce_item_plus_l2(model, batch):
    x, y = batch
    ce = F.cross_entropy(model(x), y)
    l2 = sum(p.pow(2).sum() for p in model.parameters())
    return ce.item() + 5e-4 * l2          # BUG: .item() (for the running-loss logger) drops the CE from the graph


@case("loss_item_plus_l2_penalty_only_penalty_trains", FAMILY,
      "the loss is ce.item() + 5e-4 * l2: .item() turns the cross-entropy into a Python float, so the returned "
      "tensor's only graph is the weight penalty; backward only shrinks the weights towards zero and the data term "
      "never produces a gradient",
      r"\.item\(\)|\bitem\b|detach|(python )?float|graph|does not depend|(only|just)[^.]*(penalty|regulari[sz]|weight "
      r"norm|l2|decay)|(penalty|regulari[sz]\w*|l2)[^.]*only")
def loss_item_plus_l2_penalty_only_penalty_trains():
    seed(0)
    x, y = teacher_classes(3000, 20, 4, s=34)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=ce_item_plus_l2, max_steps=2000)


# --------------------------------------------------------------------------- 5. token CE summed, SGD LR tuned for a mean


_sum_ce = nn.CrossEntropyLoss(reduction="sum")


def summed_token_ce(model, batch):
    ids, tags = batch
    logits = model(ids)
    return _sum_ce(logits.reshape(-1, logits.size(-1)), tags.reshape(-1))


@case("tagger_token_ce_reduction_sum_with_sgd", FAMILY,
      "the token loss is CrossEntropyLoss(reduction='sum') over the 32x16 tokens of a batch while SGD's lr=0.1 was "
      "tuned for a mean: every gradient is 512 times larger than intended, the effective LR is ~51 and the tagger "
      "diverges in the first steps",
      r"reduction|\bsum(med)?\b|(\blr\b|learning.?rate)[^.]*(too (high|large|big)|effective|high|large)|(scale|scaled|"
      r"grows?) (with|by) (the )?(batch|number of tokens)")
def tagger_token_ce_reduction_sum_with_sgd():
    seed(0)
    ids, tags = tagging_corpus(3000, s=35)
    model = BiGRUTagger()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                train_loader=loader(TensorDataset(ids[:2560], tags[:2560]), 32),
                val_loader=loader(TensorDataset(ids[2560:], tags[2560:]), 128, shuffle=False),
                loss_fn=summed_token_ce, max_steps=2000)


# --------------------------------------------------------------------------- 6. Adadelta's lr=1.0 kept when switching to Adam


@case("adam_keeps_adadelta_lr_1", FAMILY,
      "the script was switched from the MNIST example's Adadelta to Adam but kept its --lr default of 1.0: Adam's "
      "steps are ~lr per weight, so every update moves each weight by about 1 and the CNN's loss jumps around far "
      "above where lr=1e-3 takes it",
      r"(\blr\b|learning.?rate)[^.]*(too (high|large|big)|1\.0|\bhigh|\blarge|diverg|unstable)|Adadelta")
def adam_keeps_adadelta_lr_1():
    seed(0)
    model = plain_cnn()
    train, val = bars(s=36)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1.0), train_loader=train,
                val_loader=val, loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 7. EMA hook writes into the live weights


def attach_ema(model, optimizer, decay=0.999):
    ema = copy.deepcopy(model).requires_grad_(False)

    @torch.no_grad()
    def update_ema(opt, args, kwargs):
        for e, p in zip(ema.parameters(), model.parameters()):
            p.copy_(decay * e + (1 - decay) * p)        # BUG: the average is written into p, not into e

    optimizer.register_step_post_hook(update_ema)
    return ema


@case("ema_step_hook_overwrites_live_weights", FAMILY,
      "the EMA is updated in an optimizer step post-hook that writes decay * ema + (1 - decay) * p into the live "
      "parameter p instead of into the EMA copy: after every step the model is pulled 99.9% back to the frozen "
      "initial copy, so the weights barely move and the loss stays near its start",
      r"\bema\b|moving average|(weights?|parameters?)[^.]*(reset|revert|restor|overwrit|pulled back|unchanged|do(es)? "
      r"not change|barely (move|change)|frozen)|(post.?)?hook")
def ema_step_hook_overwrites_live_weights():
    seed(0)
    x, y = teacher_classes(3000, 20, 4, s=37)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    attach_ema(model, optimizer)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)
