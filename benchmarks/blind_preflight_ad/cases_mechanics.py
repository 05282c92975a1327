"""Mechanics: the hand-written training step (schedules, precision, loss reduction, accumulation) is wrong."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from .registry import acc_of, case, first_arg, fix, fixed_of, gen, loader, rmse_of, seed


def _mlp(d_in, d_out, hidden=64):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


def _classes(s_train, s_val, d=16, c=6):
    g = gen(s_val)
    w = torch.randn(d, c, generator=gen(s_train + 1000))
    x = torch.randn(2048, d, generator=gen(s_train))
    y = (x @ w).argmax(1)
    xv = torch.randn(512, d, generator=g)
    return x, y, xv, (xv @ w).argmax(1)


# --- M1: a warm-up LambdaLR whose factor is never capped at 1 -------------------------------------------------------

@case("mechanics_warmup_factor_never_capped", "mechanics",
      bug="the warm-up is LambdaLR(optimizer, lambda step: (step + 1) / warmup_steps) without min(1.0, ...): after "
          "the 20 warm-up steps the factor keeps growing linearly, so by step 300 the learning rate is 15x the base "
          "rate and SGD with momentum blows up",
      cause_pattern=r"min\(1(\.0)?,|(never|not) capped|(factor|multiplier|lambda)[^.]{0,60}(keeps? (growing|increasing)|grows?|exceeds? 1|above 1|unbounded)|"
                    r"learning rate[^.]{0,60}(keeps? (growing|increasing|rising)|grows?( linearly)?|\d+x the base|times the base)|"
                    r"warm[- ]?up[^.]{0,60}(never (ends|stops|plateaus)|does not (stop|end|plateau))")
def mechanics_warmup_factor_never_capped(fixed=False):
    seed(0)
    x, y, xv, yv = _classes(1, 2)
    model = _mlp(16, 6)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    warmup = 20
    factor = (lambda s: min(1.0, (s + 1) / warmup)) if fixed else (lambda s: (s + 1) / warmup)
    return dict(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, factor),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("mechanics_warmup_factor_never_capped", fixed_of(mechanics_warmup_factor_never_capped), acc_of(first_arg),
    "val accuracy")


# --- M2: the whole model cast to bfloat16 (no fp32 master weights) ---------------------------------------------------

class Bf16Net(nn.Module):
    def __init__(self, cast):
        super().__init__()
        self.net = _mlp(16, 6, 128)
        if cast:
            self.net.to(torch.bfloat16)

    def forward(self, x):
        return self.net(x.to(next(self.net.parameters()).dtype)).float()


@case("mechanics_weights_cast_to_bfloat16", "mechanics",
      bug="'mixed precision' is done by model.to(torch.bfloat16): the weights themselves are bf16 (8 significant "
          "bits) and AdamW writes each update back into them, so steps smaller than half a bf16 ulp of the weight "
          "(lr 1e-4 against weights of about 0.05-0.1) round away and most weights never move; keep fp32 weights and "
          "use autocast (precision='bf16')",
      cause_pattern=r"(weights|parameters|params)[^.]{0,40}(are|in|stored in|cast to|held in) (torch\.)?(bfloat16|bf16|half|float16|fp16)|"
                    r"(bfloat16|bf16|fp16|float16|half)[- ](precision )?(weights|parameters|params)|"
                    r"master (weights|copy)|(updates?|steps?)[^.]{0,60}(round\w*|lost|swallowed|below)[^.]{0,30}(ulp|precision|resolution|spacing)|"
                    r"model\.(to\(torch\.bfloat16\)|bfloat16\(\)|half\(\))|keep (the )?(weights|parameters) in (fp32|float32)")
def mechanics_weights_cast_to_bfloat16(fixed=False):
    seed(0)
    x, y, xv, yv = _classes(3, 4)
    model = Bf16Net(cast=not fixed)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), precision="bf16" if fixed else "fp32", max_steps=600)


fix("mechanics_weights_cast_to_bfloat16", fixed_of(mechanics_weights_cast_to_bfloat16), acc_of(first_arg),
    "val accuracy", steps=600)


# --- M3: a hand-written loss summed over the batch and outputs, with an LR tuned for the mean -------------------------

def _mixing(n, s):
    g = gen(s)
    x = torch.randn(n, 12, generator=g)
    w = torch.randn(12, 8, generator=gen(71)) / 12 ** 0.5
    return x, torch.tanh(x @ w) + 0.05 * torch.randn(n, 8, generator=g)


def _sq_error(reduce_mean):
    def sq_error(model, batch):
        x, y = batch
        err = (model(x) - y) ** 2
        return err.mean() if reduce_mean else err.sum()
    return sq_error


@case("mechanics_loss_summed_over_batch", "mechanics",
      bug="the hand-written squared error ends in .sum() over a 128 x 8 batch instead of .mean(): the gradient is "
          "1024 times the mean's, and the SGD learning rate of 0.05 (tuned for a mean loss) overshoots and diverges",
      cause_pattern=r"\.sum\(\)|reduction ?= ?['\"]?sum|summ?(ed|ing|s)? (over|across) (the )?(batch|samples|elements)|"
                    r"(instead of|not|rather than) (a |the )?mean|scales? with (the )?batch size|\.mean\(\)")
def mechanics_loss_summed_over_batch(fixed=False):
    seed(0)
    x, y = _mixing(4096, 11)
    xv, yv = _mixing(512, 12)
    model = _mlp(12, 8)
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(x, y), 128), val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=_sq_error(fixed), max_steps=300)


fix("mechanics_loss_summed_over_batch", fixed_of(mechanics_loss_summed_over_batch),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


# --- M4: the loss divided by the accumulation steps inside loss_fn, and again by the loop -----------------------------

ACCUM = 8


def _accum_loss(fixed):
    def accum_loss(model, batch):
        x, y = batch
        loss = F.cross_entropy(model(x), y)
        return loss if fixed else loss / ACCUM     # "scale for gradient accumulation"
    return accum_loss


@case("mechanics_accumulation_scaled_twice", "mechanics",
      bug="loss_fn already returns loss / accumulation_steps, and the loop (given accumulation_steps=8) divides each "
          "micro-batch loss by 8 again: the accumulated gradient is 1/8 of the full-batch gradient, so plain SGD "
          "runs at an effective learning rate 8 times smaller than set",
      cause_pattern=r"(divid\w*|scal\w*|normali[sz]\w*)[^.]{0,60}twice|(double|twice)[- ](divid\w*|scal\w*|normali[sz]\w*)|"
                    r"/ ?accum\w*|accumulation_steps[^.]{0,80}(again|already|twice|squared)|"
                    r"1 ?/ ?(8|accumulation_steps|k)\b[^.]{0,40}(gradient|of the)|effective (learning rate|lr|step)[^.]{0,40}(smaller|divided|lower|1/)")
def mechanics_accumulation_scaled_twice(fixed=False):
    seed(0)
    x, y, xv, yv = _classes(5, 6)
    model = _mlp(16, 6)
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                train_loader=loader(TensorDataset(x, y), 16), val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=_accum_loss(fixed), accumulation_steps=ACCUM, max_steps=150)


fix("mechanics_accumulation_scaled_twice", fixed_of(mechanics_accumulation_scaled_twice), acc_of(first_arg),
    "val accuracy", steps=150)


# --- M5: a LambdaLR whose lambda returns the learning rate instead of a factor ----------------------------------------

@case("mechanics_lambdalr_returns_learning_rate", "mechanics",
      bug="the decay is LambdaLR(optimizer, lambda step: 1e-3 * 0.995 ** step) on an Adam built with lr=1e-3: "
          "LambdaLR multiplies the optimizer's lr by what the lambda returns, so the effective rate is 1e-6 and "
          "below; the lambda must return the factor 0.995 ** step",
      cause_pattern=r"multipl\w*[^.]{0,60}(factor|base|initial|optimi[sz]er'?s?) (lr|learning rate)|"
                    r"(lambda|lr_lambda)[^.]{0,60}(returns?|gives?)[^.]{0,30}(learning rate|lr)\b[^.]{0,30}(instead of|not) (a )?(factor|multiplier)|"
                    r"(factor|multiplier),? not (a|the) (learning rate|lr)|1e-6|1e-3 ?\* ?1e-3|lr (applied|multiplied) twice|"
                    r"(learning rate|lr) (is|of|at) (about |around )?1e-0?[6-9]")
def mechanics_lambdalr_returns_learning_rate(fixed=False):
    seed(0)
    x, y, xv, yv = _classes(7, 8)
    model = _mlp(16, 6)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    decay = (lambda s: 0.995 ** s) if fixed else (lambda s: 1e-3 * 0.995 ** s)
    return dict(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, decay),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("mechanics_lambdalr_returns_learning_rate", fixed_of(mechanics_lambdalr_returns_learning_rate), acc_of(first_arg),
    "val accuracy")
