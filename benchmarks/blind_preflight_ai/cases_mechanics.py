"""Set ai, family mechanics: the update itself goes wrong (a linear-decay schedule sized in epochs, weights stored in
bfloat16, a LambdaLR returning a learning rate instead of a factor, TensorFlow's keep_prob given to nn.Dropout, a
ReLU after the regression output)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset
from transformers import get_linear_schedule_with_warmup

from benchmarks.blind_preflight_ai.cases_trained import nonlinear_classes, topic_docs
from benchmarks.blind_preflight_ai.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_of,
    seed,
    teacher_regression,
)

# ---------------------------------------------------------------------------------------------------------------
# ai_linear_schedule_epochs: text classifier with transformers' linear warm-up/decay schedule

EPOCHS = 3


class BagOfWords(nn.Module):
    def __init__(self, vocab=400, dim=32, n_classes=4):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.fc = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, n_classes))

    def forward(self, ids):
        return self.fc(self.emb(ids))


@case("ai_linear_schedule_epochs", "mechanics",
      bug="The schedule is get_linear_schedule_with_warmup(optimizer, 0, num_training_steps=EPOCHS) with EPOCHS = "
          "3, but it is stepped once per batch: the learning rate decays linearly to 0 after 3 optimizer steps and "
          "stays 0 for the rest of the 1000-step run. num_training_steps counts optimizer steps (len(loader) * "
          "epochs).",
      cause_pattern=r"num_training_steps|get_linear_schedule|(learning rate|LR|lr)\w*.{0,80}(reach|hit|decay|drop)"
                    r"\w*.{0,30}(0|zero)|(0|zero) (learning rate|LR|lr)|epochs? (instead of|rather than|vs\.?|not) "
                    r"(optimi[sz]er )?steps|(total|training) steps.{0,60}(epoch|too (few|small|short))")
def linear_schedule_epochs(fixed: bool = False):
    seed(0)
    x, y = topic_docs(1600, 31)
    model = BagOfWords()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    train = loader(TensorDataset(x[:1200], y[:1200]), 32)
    max_steps = 1000
    total = max_steps if fixed else EPOCHS                         # BUG: epochs where steps are counted
    return dict(model=model, optimizer=opt, train_loader=train,
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 400, shuffle=False),
                scheduler=get_linear_schedule_with_warmup(opt, num_warmup_steps=0, num_training_steps=total),
                loss_fn=nn.CrossEntropyLoss(), max_steps=max_steps)


fix("ai_linear_schedule_epochs", fixed_of(linear_schedule_epochs),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=200)

# ---------------------------------------------------------------------------------------------------------------
# ai_pure_bf16_weights: tabular regression, the model cast to bfloat16 "to save memory"


@case("ai_pure_bf16_weights", "mechanics",
      bug="The model is cast with model.to(torch.bfloat16) and trained with precision='bf16': the weights "
          "themselves are stored in bfloat16 (8 bits of mantissa), so an AdamW update of about 3e-4 on a weight "
          "of size 0.1-0.5 is smaller than half a bfloat16 step and rounds away; most weights never move. Mixed "
          "precision keeps fp32 master weights and autocasts only the compute.",
      cause_pattern=r"to\(torch\.bfloat16\)|\.bfloat16\(\)|\.half\(\)|(parameters|weights) (are |stored |kept )?"
                    r"(in )?(bf16|bfloat16|fp16|half)|master weights|fp32 (master|copy|weights)|"
                    r"(update|step)s?.{0,60}(round\w* (away|to zero|off)|smaller than .{0,30}(ulp|spacing|step))|"
                    r"(bf16|bfloat16|low[- ]precision) (param|weight)")
def pure_bf16_weights(fixed: bool = False):
    seed(0)
    x, y = teacher_regression(1500, 12, s=32)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1),
                          nn.Flatten(0))
    if not fixed:
        model = model.to(torch.bfloat16)        # BUG: bf16 storage, no fp32 master copy
    dtype = next(model.parameters()).dtype
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0),
                train_loader=loader(TensorDataset(x[:1200].to(dtype), y[:1200].to(dtype)), 32),
                val_loader=loader(TensorDataset(x[1200:].to(dtype), y[1200:].to(dtype)), 300, shuffle=False),
                loss_fn=nn.MSELoss(), precision="bf16", max_steps=800)


fix("ai_pure_bf16_weights", fixed_of(pure_bf16_weights),
    rmse_of(lambda m, b: (m(b[0]).float(), b[1].float())), "val RMSE", steps=300, higher=False)

# ---------------------------------------------------------------------------------------------------------------
# ai_lambdalr_returns_lr: image-like tabular classifier with an exponential decay written as a LambdaLR

BASE_LR = 1e-3


@case("ai_lambdalr_returns_lr", "mechanics",
      bug="The decay is LambdaLR(optimizer, lambda step: BASE_LR * 0.999 ** step) on an Adam optimizer already "
          "built with lr=BASE_LR: LambdaLR multiplies the optimizer's initial lr by what the lambda returns, so "
          "the effective learning rate is BASE_LR squared (1e-6) from the first step and the model barely moves. "
          "The lambda must return a factor, 0.999 ** step.",
      cause_pattern=r"LambdaLR|lr_lambda|(multiplicative )?factor.{0,60}(not|instead of|rather than).{0,30}"
                    r"(learning rate|lr)|(learning rate|lr).{0,60}(squared|multiplied twice|twice)|1e-0?6|"
                    r"(initial|base) (lr|learning rate) (multiplied|times)")
def lambdalr_returns_lr(fixed: bool = False):
    seed(0)
    x, y = nonlinear_classes(1600, 33)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=BASE_LR)
    if fixed:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.999 ** step)
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: BASE_LR * 0.999 ** step)
    return dict(model=model, optimizer=opt, scheduler=sched,
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=800)


fix("ai_lambdalr_returns_lr", fixed_of(lambdalr_returns_lr),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)

# ---------------------------------------------------------------------------------------------------------------
# ai_dropout_keep_prob: a Keras/TF1 model ported to PyTorch

KEEP_PROB = 0.9   # from the TF1 code: tf.nn.dropout(h, keep_prob=0.9)


@case("ai_dropout_keep_prob", "mechanics",
      bug="The model was ported from TensorFlow 1, whose dropout takes keep_prob=0.9, and the value went straight "
          "into nn.Dropout(0.9): PyTorch's p is the probability of zeroing, so 90% of every hidden layer is dropped "
          "at each training step and the survivors are scaled by 10; the net underfits badly.",
      cause_pattern=r"keep_prob|Dropout\(0?\.9\)|(p|dropout (rate|probability)) ?(=|of|is) ?0?\.9|"
                    r"(probability|fraction) (of|to) (zero|drop)|drop(s|ping)? 90|90 ?% .{0,30}(dropped|zeroed)|"
                    r"(keep|retain) probability")
def dropout_keep_prob(fixed: bool = False):
    seed(0)
    x, y = nonlinear_classes(1600, 34)
    p = 1 - KEEP_PROB if fixed else KEEP_PROB
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(p), nn.Linear(64, 64), nn.ReLU(),
                          nn.Dropout(p), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=800)


fix("ai_dropout_keep_prob", fixed_of(dropout_keep_prob),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)

# ---------------------------------------------------------------------------------------------------------------
# ai_relu_output_head: demand forecasting on standardised targets with a ReLU after the last layer


def demand_rows(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    w = torch.randn(10, generator=g) / 3
    y = torch.sin(x @ w) * 1.5 + 0.3 * (x[:, 0] * x[:, 1]) + 0.05 * torch.randn(n, generator=g)
    y = (y - y[: int(0.8 * n)].mean()) / y[: int(0.8 * n)].std()
    return x, y


@case("ai_relu_output_head", "mechanics",
      bug="The regression net ends in nn.Linear(64, 1) followed by nn.ReLU(), 'because every layer has an "
          "activation', while the target is standardised (half of it negative): the model cannot output anything "
          "below 0, and rows whose pre-activation goes negative get no gradient at all.",
      cause_pattern=r"ReLU.{0,60}(output|last|final|head)|(output|last|final) (layer|activation).{0,60}ReLU|"
                    r"(cannot|can't|never) (output|predict|produce) (negative|anything below)|"
                    r"negative (target|value)s?.{0,60}(unreachable|cannot|never)|non-?negative (output|prediction)")
def relu_output_head(fixed: bool = False):
    seed(0)
    x, y = demand_rows(1500, 35)
    layers = [nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)]
    if not fixed:
        layers.append(nn.ReLU())                # BUG: clamps the prediction at 0
    model = nn.Sequential(*layers, nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 300, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=800)


fix("ai_relu_output_head", fixed_of(relu_output_head), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE",
    steps=250, higher=False)
