"""Set ac, family mechanics: the loss, the optimizer, the schedule or the initialisation quietly stop learning."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ac.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed


def argmax_acc():
    return acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))


# --- NLLLoss on raw logits ------------------------------------------------------------------------------------

def ring_table(n, s):
    """Sensor readings (6 features); class = ring of the radius of the first two (classes share a mean of zero)."""
    g = gen(s)
    x = torch.randn(n, 6, generator=g)
    r = x[:, :2].norm(dim=1)
    return x, torch.bucketize(r, torch.tensor([0.8, 1.5]))


@case("nllloss_on_raw_logits", "mechanics",
      bug="The classifier ends in a plain nn.Linear and is trained with nn.NLLLoss, which expects log-probabilities: "
          "without log_softmax the loss is just minus the true-class logit, unbounded below, so it falls forever by "
          "inflating logits while nothing pushes the wrong classes down.",
      cause_pattern=r"NLLLoss|log_?softmax|log[- ]probabilit|(raw|unnormali[sz]ed) (logits|scores|outputs).{0,80}"
                    r"(nll|negative log)|unbounded below|(loss|it) (goes|went|is|becomes) negative")
def nllloss_on_raw_logits(fixed=False):
    seed(0)
    x, y = ring_table(2000, 31)
    model = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 32),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss() if fixed else nn.NLLLoss(), max_steps=1500)


fix("nllloss_on_raw_logits", fixed_of(nllloss_on_raw_logits), argmax_acc(), "val accuracy", steps=300)


# --- LambdaLR returning a learning rate instead of a factor ------------------------------------------------------

def house_table(n, s):
    g = gen(s)
    x = torch.randn(n, 12, generator=g)
    w = torch.randn(12, generator=g) / 12 ** 0.5
    y = 2 * torch.tanh(x @ w) + 0.5 * x[:, 0] * x[:, 1] + 0.1 * torch.randn(n, generator=g)
    return x, y.unsqueeze(1)


def house_mlp():
    return nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


@case("lambdalr_returns_lr_not_factor", "mechanics",
      bug="The schedule is LambdaLR(optimizer, lambda step: 1e-3 * 0.999 ** step), written as if the lambda returned "
          "the learning rate; LambdaLR multiplies the optimizer's lr=1e-3 by it, so training runs at about 1e-6 "
          "from the first step and the regression barely moves.",
      cause_pattern=r"LambdaLR|lr_lambda|(multiplicative|multiplier|scale) factor|factor.{0,60}(not|instead of|rather "
                    r"than) (a|the) (learning rate|lr)|(learning rate|lr)\w*.{0,60}(1e-6|1e-06|0\.000001|squared|"
                    r"multiplied (twice|by itself))|(base|initial) (lr|learning rate) (times|multiplied)")
def lambdalr_returns_lr_not_factor(fixed=False):
    seed(0)
    x, y = house_table(2000, 32)
    model = house_mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if fixed:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.999 ** step)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1e-3 * 0.999 ** step)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 32),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 128, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1500)


fix("lambdalr_returns_lr_not_factor", fixed_of(lambdalr_returns_lr_not_factor),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", steps=300, higher=False)


# --- Adam eps=1.0 copied from a TensorFlow note -------------------------------------------------------------------

@case("adam_eps_one", "mechanics",
      bug="Adam is built with eps=1.0 (the TensorFlow docs' value for Inception on ImageNet, copied across): with "
          "gradients far below 1 the update lr * m / (sqrt(v) + eps) is about lr * gradient, a thousand times "
          "smaller than Adam's normalised step, so the model hardly trains.",
      cause_pattern=r"\beps(ilon)?\b|sqrt\(v\)|denominator|(adam|adaptive)\w*.{0,80}(normali[sz]|effective (step|"
                    r"lr|learning rate)).{0,60}(small|tiny|disabled|lost)")
def adam_eps_one(fixed=False):
    seed(0)
    x, y = house_table(2000, 33)
    model = house_mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8 if fixed else 1.0)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 32),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 128, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1500)


fix("adam_eps_one", fixed_of(adam_eps_one), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", steps=300,
    higher=False)


# --- ReLU on the regression output ------------------------------------------------------------------------------

def temperature_windows(n, s):
    """Standardised temperature anomalies: 24 hourly readings -> the next day's mean anomaly (half negative)."""
    g = gen(s)
    base = torch.randn(n, 1, generator=g)
    trend = 0.5 * torch.randn(n, 1, generator=g)
    t = torch.arange(24).float() / 24
    x = base + trend * t + 0.3 * torch.sin(6.283 * t) + 0.2 * torch.randn(n, 24, generator=g)
    y = base + 1.3 * trend + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


@case("relu_on_regression_output", "mechanics",
      bug="The forecaster's nn.Sequential ends Linear -> ReLU, so it can only output values >= 0 while the "
          "standardised targets are negative half the time; every negative target is predicted as 0 and the ReLU "
          "passes no gradient for them.",
      cause_pattern=r"(relu|non-?negative|clamp|>= ?0).{0,100}(output|final|last|head|prediction)|(output|final|last|"
                    r"head|prediction)\w*.{0,100}(relu|non-?negative|>= ?0|cannot (be |go )?negative)|negative "
                    r"(target|value|label)s?.{0,80}(cannot|can't|never|unreachable)")
def relu_on_regression_output(fixed=False):
    seed(0)
    x, y = temperature_windows(2000, 34)
    layers = [nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)]
    if not fixed:
        layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 32),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 128, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1500)


fix("relu_on_regression_output", fixed_of(relu_on_regression_output), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", steps=300, higher=False)


# --- every weight initialised to the same constant ---------------------------------------------------------------

def spiral_table(n, s):
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    r = torch.rand(n, generator=g) * 3 + 0.3
    theta = 1.6 * r + y * 2.094 + 0.25 * torch.randn(n, generator=g)
    xy = torch.stack([r * torch.cos(theta), r * torch.sin(theta)], 1)
    return torch.cat([xy, 0.5 * torch.randn(n, 2, generator=g)], 1), y


def init_constant(module):
    if isinstance(module, nn.Linear):
        nn.init.constant_(module.weight, 0.05)
        nn.init.zeros_(module.bias)


def init_xavier(module):
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        nn.init.zeros_(module.bias)


@case("constant_weight_init", "mechanics",
      bug="model.apply(init_weights) sets every nn.Linear weight to the same constant 0.05 (and biases to 0): all "
          "hidden units of a layer compute the same function and get the same gradient, the symmetry is never "
          "broken, and the 64-wide MLP behaves like one unit per layer.",
      cause_pattern=r"symmetr|constant_|(same|identical|equal|constant) (value|weights?|init\w*|constant)|"
                    r"(units|neurons|rows|columns)\w*.{0,60}(identical|the same|duplicate)|(identical|duplicate)\w* "
                    r"(units|neurons)|xavier|kaiming")
def constant_weight_init(fixed=False):
    seed(0)
    x, y = spiral_table(2000, 35)
    model = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3))
    model.apply(init_xavier if fixed else init_constant)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 32),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


fix("constant_weight_init", fixed_of(constant_weight_init), argmax_acc(), "val accuracy", steps=300)
