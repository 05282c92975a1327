"""Set an, family mechanics: custom autograd, precision, schedule, accumulation and regularisation mechanics."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_an.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    loader,
    seed,
    teacher_classes,
)


def _dev(m):
    return next(m.parameters()).device


def _cls_fwd(m, b):
    return m(b[0].to(_dev(m))).argmax(-1).cpu(), b[1]


# ----------------------------------------------------------------------------------------------------------------
# Straight-through binariser (custom torch.autograd.Function) whose backward computes the gradient but never returns it.

class BinarizeSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.where(x >= 0, torch.ones_like(x), -torch.ones_like(x))

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        grad_input = grad_output.clone()
        grad_input[x.abs() > 1] = 0  # straight-through inside [-1, 1]
        # (the return statement was lost when the debugging prints were removed)


class BinarizeSTEFixed(BinarizeSTE):
    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        grad_input = grad_output.clone()
        grad_input[x.abs() > 1] = 0
        return grad_input


class BinaryCodeNet(nn.Module):
    """Keyword-spotting features -> 8 binary codes (a hashing layer for the on-device model) -> classifier."""

    def __init__(self, fixed: bool, d_in: int = 40, bits: int = 8, classes: int = 6):
        super().__init__()
        self.fn = BinarizeSTEFixed if fixed else BinarizeSTE
        self.encode = nn.Sequential(nn.Linear(d_in, 64), nn.ReLU(), nn.Linear(64, bits))
        self.classify = nn.Sequential(nn.Linear(bits, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, x):
        return self.classify(self.fn.apply(self.encode(x)))


def build_ste_no_return(fixed: bool = False) -> dict:
    seed(0)
    x, y = teacher_classes(2400, 40, 6, s=31)
    model = BinaryCodeNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


case("an_mech_ste_no_return", "mechanics",
     "The straight-through binariser, a custom torch.autograd.Function, computes grad_input in backward but has no "
     "return statement, so backward returns None: autograd treats it as a zero gradient and every layer before the "
     "binariser (the encoder) never receives a gradient.",
     r"autograd\.Function|custom (autograd )?(function|backward)|backward\(\) (returns?|returned) None|"
     r"(returns?|returned) None|straight[- ]through|STE\b|"
     r"(encoder|layers?|parameters?|weights?).{0,60}(before|upstream of|below).{0,60}(no|zero|None) grad|"
     r"(no|zero|None) grad(ient)?s?.{0,80}(encoder|upstream|earlier layers|first layers)")(build_ste_no_return)
fix("an_mech_ste_no_return", fixed_of(build_ste_no_return), acc_of(_cls_fwd), "val accuracy")


# ----------------------------------------------------------------------------------------------------------------
# "Pure bf16" training: the weights themselves cast to bfloat16, so small AdamW updates round away.

class Bf16Mlp(nn.Module):
    def __init__(self, d_in: int = 32, classes: int = 5):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                                 nn.Linear(128, classes))

    def forward(self, x):
        return self.net(x.to(self.net[0].weight.dtype))


def build_bf16_weights(fixed: bool = False) -> dict:
    seed(0)
    x, y = teacher_classes(2400, 32, 5, s=32)
    model = Bf16Mlp()
    if not fixed:
        model = model.to(torch.bfloat16)  # "bf16 training halves the memory"
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), precision="bf16", max_steps=3000)


case("an_mech_bf16_weights", "mechanics",
     "The model's parameters are cast with model.to(torch.bfloat16) instead of training fp32 weights under bf16 "
     "autocast; with lr=1e-4 most AdamW updates are smaller than half a bf16 ulp of the weight and round away, so "
     "the weights barely move.",
     r"bfloat16 (param|weight)|(param|weight)s?.{0,40}(stored |kept |are |in )(in )?bf(loat)?16|"
     r"(fp32|float32|full[- ]precision) (master )?(weights?|copy|params?)|master weights|"
     r"(update|step)s?.{0,80}(round(ed|s)? (away|off|to zero)|lost|below.{0,30}(precision|resolution|ulp))|"
     r"(low|half|reduced)[- ]precision (weights|parameters)|model\.(to\(torch\.bfloat16\)|bfloat16\(\)|half\(\))")(
    build_bf16_weights)
fix("an_mech_bf16_weights", fixed_of(build_bf16_weights), acc_of(_cls_fwd), "val accuracy")


# ----------------------------------------------------------------------------------------------------------------
# Warm-up counted in samples, not optimizer steps: the LR never leaves the ramp during the run.

def build_warmup_in_samples(fixed: bool = False) -> dict:
    from transformers import get_linear_schedule_with_warmup

    seed(0)
    x, y = teacher_classes(2400, 32, 6, s=33)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 6))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    train = TensorDataset(x[:2000], y[:2000])
    batch, epochs = 32, 8
    steps = epochs * (len(train) // batch)
    if fixed:
        warmup, total = int(0.05 * steps), steps
    else:
        warmup, total = int(0.05 * len(train) * epochs), len(train) * epochs  # counted over the dataset
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=warmup, num_training_steps=total)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=loader(train, batch),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=steps)


case("an_mech_warmup_in_samples", "mechanics",
     "The linear warm-up schedule is given num_warmup_steps and num_training_steps counted in samples "
     "(len(dataset) * epochs) instead of optimizer steps, so the warm-up (800 'steps') lasts longer than the whole "
     "500-step run and the learning rate never reaches its peak.",
     r"num_warmup_steps|num_training_steps|"
     r"warm-?up.{0,80}(longer than|exceeds?|outlasts?|never (ends|finishes|completes)|beyond|more than|past) (the )?"
     r"(whole |entire )?(run|training|max_steps|total)|"
     r"(learning rate|LR).{0,80}(never reach|still ramping|stays? (low|tiny|small|near zero|below)|far below)|"
     r"(counted|measured|given) in (samples|examples)|(samples|examples) (instead of|rather than|not) (optimi[sz]er )?steps|"
     r"(schedule|scheduler).{0,80}(longer than|exceeds?|beyond|past) (the )?(run|max_steps|training)")(
    build_warmup_in_samples)
fix("an_mech_warmup_in_samples", fixed_of(build_warmup_in_samples), acc_of(_cls_fwd), "val accuracy")


# ----------------------------------------------------------------------------------------------------------------
# Gradient accumulation: the loss function divides by accumulation_steps and the loop divides again.

ACCUM = 8


def build_accum_double_div(fixed: bool = False) -> dict:
    seed(0)
    x, y = teacher_classes(2400, 32, 6, s=34)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 6))
    ce = nn.CrossEntropyLoss()

    def accum_loss(model, batch):
        loss = ce(model(batch[0]), batch[1])
        return loss if fixed else loss / ACCUM  # "normalise for accumulation", as in the tutorial

    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 8),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=accum_loss, accumulation_steps=ACCUM, max_steps=300)


case("an_mech_accum_double_div", "mechanics",
     "With accumulation_steps=8, the loss function already divides the loss by the accumulation steps and the "
     "training loop divides each micro-batch loss by 8 again, so the gradient is 1/64 of the batch mean instead of "
     "1/8 summed over 8 micro-batches: plain SGD takes 8 times smaller steps.",
     r"accumulat.{0,80}(divid|scal|normali[sz]|/ ?accum).{0,40}(twice|double|two times|again)|"
     r"(twice|double|two times|again).{0,80}accumulat|"
     r"(divid|scal)\w* (by )?(accumulation_steps|the accumulation).{0,40}(twice|again)|"
     r"(gradient|loss).{0,40}(1/64|accumulation_steps ?\*\* ?2|squared)|loss / ?accum")(build_accum_double_div)
fix("an_mech_accum_double_div", fixed_of(build_accum_double_div), acc_of(_cls_fwd), "val accuracy")


# ----------------------------------------------------------------------------------------------------------------
# Dropout ported from TensorFlow's keep_prob=0.9 as nn.Dropout(p=0.9): 90% of the activations are dropped.

def build_dropout_keep_prob(fixed: bool = False) -> dict:
    seed(0)
    x, y = teacher_classes(2400, 32, 6, s=35)
    keep_prob = 0.9
    p = 1 - keep_prob if fixed else keep_prob
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Dropout(p), nn.Linear(128, 128), nn.ReLU(),
                          nn.Dropout(p), nn.Linear(128, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


case("an_mech_dropout_keep_prob", "mechanics",
     "The network was ported from TensorFlow, where dropout's keep_prob=0.9 keeps 90% of the units, into "
     "nn.Dropout(p=0.9), where p is the probability of dropping: 90% of the hidden activations are zeroed at every "
     "training step.",
     r"keep_prob|Dropout\(p ?= ?0\.9|dropout (p|rate|probability)\w*.{0,40}(0\.9|90 ?%|too high|very high)|"
     r"(drop|zero)\w* (out )?90 ?%|(probability|fraction) (to|of) (drop|zero)|"
     r"p is the (drop|zero)")(build_dropout_keep_prob)
fix("an_mech_dropout_keep_prob", fixed_of(build_dropout_keep_prob), acc_of(_cls_fwd), "val accuracy")
