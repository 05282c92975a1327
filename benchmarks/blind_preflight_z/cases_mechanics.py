"""Mechanics: the loss, the schedule, the precision, the backward path or the dropout do not do what the user
copied them for."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_z.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    model_device,
    plain_acc,
    seed,
    to_dev,
)


def _churn(n, d=16, c=3, s=21):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, c, generator=gen(s + 100))
    y = (x @ w + 0.5 * torch.tanh(x[:, :c] * x[:, c:2 * c])).argmax(1)
    return x, y


def _mlp(d=16, c=3, h=64):
    return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, c))


# --------------------------------------------------------------------------------------------------------------
# 1. Customer churn classifier whose loss is computed "like sklearn's log_loss" in numpy; after
#    "element 0 of tensors does not require grad" the result was wrapped in torch.tensor(..., requires_grad=True).


def _numpy_log_loss(fixed):
    def loss_fn(model, batch):
        x, y = to_dev(model, *batch)
        logits = model(x)
        if fixed:
            return F.cross_entropy(logits, y)
        probs = torch.softmax(logits, 1).detach().cpu().numpy()
        picked = probs[np.arange(len(probs)), y.cpu().numpy()]
        value = float(-np.log(np.clip(picked, 1e-7, 1.0)).mean())
        return torch.tensor(value, requires_grad=True)  # "fixes" the backward error; cut from the model
    return loss_fn


@case("loss_rewrapped_in_new_tensor", "mechanics",
      "The loss is computed in numpy from detached probabilities and re-wrapped with torch.tensor(value, "
      "requires_grad=True) to silence 'element 0 of tensors does not require grad': the new leaf tensor has no "
      "graph back to the model, so backward gives the weights no gradient and nothing trains.",
      r"torch\.tensor\(.{0,40}requires_grad|new (leaf )?tensor|(not|no longer) (connected|attached)|"
      r"(cut|detached|disconnected) from the (graph|model|parameters)|no grad(ient)?s? (reach|flow|for)|"
      r"numpy|grad_fn|computation graph")
def loss_rewrapped_in_new_tensor(fixed: bool = False):
    seed(0)
    x, y = _churn(2000)
    model = _mlp()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False), loss_fn=_numpy_log_loss(fixed))


fix("loss_rewrapped_in_new_tensor", fixed_of(loss_rewrapped_in_new_tensor), plain_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 2. Warm-up + inverse-sqrt schedule written with LambdaLR whose lambda returns the learning rate itself
#    (base_lr * factor) instead of the multiplicative factor: the effective LR is base_lr ** 2 * factor.

BASE_LR = 1e-3


def _warmup_inv_sqrt(step, warmup=30):
    step = step + 1
    return min(step / warmup, math.sqrt(warmup / step))


@case("lambdalr_returns_lr_not_factor", "mechanics",
      "The LambdaLR lambda returns base_lr * warmup_factor (an absolute learning rate) although LambdaLR multiplies "
      "the optimizer's lr by what the lambda returns, so the effective learning rate is 1e-3 * 1e-3 = 1e-6 and the "
      "model barely moves.",
      r"LambdaLR|lr_lambda|multiplicative factor|(multipl(y|ies|ied)|scale[sd]?).{0,40}(base|initial|optimizer'?s?) "
      r"(lr|learning rate)|base_lr ?\*|1e-6|learning rate.{0,40}(tiny|too (small|low)|squared)")
def lambdalr_returns_lr_not_factor(fixed: bool = False):
    seed(0)
    x, y = _churn(2000, s=22)
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=BASE_LR)
    if fixed:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _warmup_inv_sqrt(s))
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: BASE_LR * _warmup_inv_sqrt(s))
    return dict(model=model, optimizer=opt, scheduler=sched, max_steps=300,
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False), loss_fn=nn.CrossEntropyLoss())


fix("lambdalr_returns_lr_not_factor", fixed_of(lambdalr_returns_lr_not_factor), plain_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 3. "Mixed precision" by hand: model.to(torch.bfloat16) and inputs cast to bf16, trained with Adam at lr 2e-4.
#    The weights themselves are bf16 (8 significant bits), so each Adam update (~lr) is below half a bf16 step
#    for weights of magnitude ~0.1-0.3 and is rounded away.


def _bf16_loss(fixed):
    def loss_fn(model, batch):
        x, y = batch
        p = next(model.parameters())
        logits = model(x.to(device=p.device, dtype=p.dtype))
        return F.cross_entropy(logits.float(), y.to(p.device))
    return loss_fn


def bf16_acc(model, kw):
    p = next(model.parameters())
    return acc_of(lambda m, b: (m(b[0].to(device=p.device, dtype=p.dtype)).float().argmax(-1), b[1]))(model, kw)


@case("pure_bf16_weights_adam", "mechanics",
      "The whole model is cast with model.to(torch.bfloat16) and trained with Adam at lr 2e-4: the parameters "
      "themselves are bf16, so an update of about lr is smaller than half the bf16 spacing of weights around 0.1-0.3 "
      "and rounds back to the old value; the weights barely change (keep fp32 master weights and use autocast).",
      r"(weights|parameters|model).{0,40}(cast|stored|are|kept|held|in) (to |as )?(bf16|bfloat16|low precision)|"
      r"\.to\(torch\.bfloat16\)|(master|fp32|float32) (weights|copy|parameters)|"
      r"(updates?|steps?).{0,60}(rounded|lost|swallowed|below|smaller than).{0,40}(precision|spacing|resolution|ulp)")
def pure_bf16_weights_adam(fixed: bool = False):
    seed(0)
    x, y = _churn(2000, s=23)
    model = _mlp(h=32)
    if not fixed:
        model = model.to(torch.bfloat16)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-4),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False), loss_fn=_bf16_loss(fixed))


fix("pure_bf16_weights_adam", fixed_of(pure_bf16_weights_adam), bf16_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 4. Hand-unrolled GRUCell over a session of clicks; h = h.detach() inside the time loop (the "fix" for
#    "Trying to backward through the graph a second time") cuts backprop-through-time to one step. The label
#    is the first click's category, read from the last hidden state.

CATS, STEPS = 4, 10


class ClickRNN(nn.Module):
    def __init__(self, fixed=False):
        super().__init__()
        self.cell = nn.GRUCell(CATS + 1, 32)
        self.out = nn.Linear(32, CATS)
        self.fixed = fixed

    def forward(self, x):
        h = x.new_zeros(x.size(0), 32)
        for t in range(x.size(1)):
            h = self.cell(x[:, t], h)
            if not self.fixed:
                h = h.detach()
        return self.out(h)


def _sessions(n, s=24):
    g = gen(s)
    cats = torch.randint(0, CATS, (n, STEPS), generator=g)
    x = F.one_hot(cats, CATS + 1).float()
    x[:, 1:, CATS] = 1.0  # "not first" marker
    return x, cats[:, 0]


@case("hidden_detached_every_timestep", "mechanics",
      "Inside the hand-written GRUCell loop the hidden state is cut with h = h.detach() at every time step, so "
      "backpropagation through time stops after one step and the recurrent weights never learn to carry the first "
      "click to the last hidden state (detach between batches, not between steps).",
      r"\bh = h\.detach|hidden( state)?.{0,30}detach|detach\w*.{0,60}(time ?step|each step|every step|per step|"
      r"the loop)|backprop(agation)? through time|BPTT|truncat|gradients? (only|stop).{0,40}(one|last|single) "
      r"(time ?)?step")
def hidden_detached_every_timestep(fixed: bool = False):
    seed(0)
    x, y = _sessions(2000)
    model = ClickRNN(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False), loss_fn=nn.CrossEntropyLoss())


fix("hidden_detached_every_timestep", fixed_of(hidden_detached_every_timestep), plain_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# 5. Port of a TF1 model: keep_prob = 0.9 passed as nn.Dropout(p=keep_prob). PyTorch's p is the probability of
#    zeroing, so 90% of the inputs and hidden units are dropped at every step.

KEEP_PROB = 0.9


@case("dropout_keep_prob_as_p", "mechanics",
      "The TF1 keep_prob=0.9 is passed as nn.Dropout(p=0.9), but PyTorch's p is the drop probability: 90% of the "
      "inputs and hidden units are zeroed at every training step (use p=1 - keep_prob = 0.1).",
      r"keep_prob|drop(out)? (probability|rate)|p\s*=\s*0\.9|0\.9.{0,60}(drop|zero)|1 ?- ?keep|"
      r"(drop|zero)\w*.{0,30}90 ?%|90 ?%.{0,30}(drop|zero|units)|(probability|fraction) of (zeroing|dropping)")
def dropout_keep_prob_as_p(fixed: bool = False):
    seed(0)
    x, y = _churn(2000, d=20, c=4, s=25)
    p = 1 - KEEP_PROB if fixed else KEEP_PROB
    model = nn.Sequential(nn.Dropout(p), nn.Linear(20, 64), nn.ReLU(), nn.Dropout(p), nn.Linear(64, 64), nn.ReLU(),
                          nn.Dropout(p), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False), loss_fn=nn.CrossEntropyLoss())


fix("dropout_keep_prob_as_p", fixed_of(dropout_keep_prob_as_p), plain_acc, "val accuracy")
_ = model_device
