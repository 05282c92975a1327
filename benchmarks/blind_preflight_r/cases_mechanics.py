"""Set r, family mechanics: the optimisation machinery (schedule, regularisation, init, loss reduction) misused."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_r.registry import case, eval_acc, eval_rmse, fix, fixed_of, gen, loader, seed


def acc(m, kw):
    return eval_acc(m, kw["val_loader"], lambda mm, b: (mm(b[0]).argmax(-1), b[1]))


def rmse(m, kw):
    return eval_rmse(m, kw["val_loader"], lambda mm, b: (mm(b[0]), b[1]))


def regression(n, s, d=10):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=gen(41))
    y = (torch.sin(x @ w / 2) * 2 + 0.5 * x[:, 0] * x[:, 1] + 0.1 * torch.randn(n, generator=g))[:, None]
    return x, y


# --- 1. house prices: LambdaLR returning a learning rate instead of a factor -------------------------------------


def house(fixed=False):
    seed(0)
    x, y = regression(1500, 42)
    vx, vy = regression(500, 43)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    if fixed:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda step: 0.995 ** step)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda step: 1e-2 * 0.995 ** step)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False), loss_fn=nn.MSELoss(), max_steps=300)


case("house_lambdalr_returns_lr_not_factor", "mechanics",
     "The LambdaLR lr_lambda returns the desired learning rate (1e-2 * 0.995**step) rather than a multiplicative "
     "factor, so the actual LR is the base 1e-2 times that, 1e-4 from the first step: 100x smaller than intended.",
     r"lambda ?lr|lr_lambda|multiplicative factor|(factor|multiplier) (of|on|applied to) the (base|initial) (lr|learning rate)|"
     r"(base|initial) (lr|learning rate) (times|multiplied by|\*)|multipl\w* the (base|initial) (lr|learning rate)|"
     r"(absolute|actual) (lr|learning rate) instead of (a )?factor")(house)
fix("house_lambdalr_returns_lr_not_factor", fixed_of(house), rmse, "val RMSE", higher=False)

# --- 2. handwritten digits: Dropout(0.9) meant as TF1 keep_prob=0.9 ----------------------------------------------


def digits(n, s):
    g = gen(s)
    protos = (torch.rand(10, 64, generator=gen(44)) > 0.6).float()
    y = torch.randint(0, 10, (n,), generator=g)
    x = protos[y] + 0.7 * torch.randn(n, 64, generator=g)
    return x, y


def digit(fixed=False):
    seed(0)
    x, y = digits(1500, 45)
    vx, vy = digits(500, 46)
    keep_prob = 0.9                                 # from the TF1 notebook: tf.nn.dropout(h, keep_prob)
    p = 1 - keep_prob if fixed else keep_prob
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(p), nn.Linear(32, 32), nn.ReLU(), nn.Dropout(p),
                          nn.Linear(32, 10))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("digits_dropout_keep_prob_0_9", "mechanics",
     "nn.Dropout(0.9) was ported from TF1's keep_prob=0.9, but PyTorch's p is the probability of zeroing, so 90% of "
     "the hidden units are dropped at every training step instead of 10%.",
     r"keep_?prob|keep probability|(drop|zero)\w* (90|0\.9)|(90 ?%|0\.9).{0,60}(drop|zero)|dropout\(0\.9\)|"
     r"p (is|=) (the )?probability of (zeroing|dropping)|(probability|fraction) (to|of) (keep|keeping|retain)")(digit)
fix("digits_dropout_keep_prob_0_9", fixed_of(digit), acc, "val accuracy")

# --- 3. churn MLP: every Linear weight initialised to zero -----------------------------------------------------


def churn(n, s):
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    y = ((x[:, 0] * x[:, 1] > 0) ^ (x[:, 2] > 0.5)).long()
    return x, y


def churn_case(fixed=False):
    seed(0)
    x, y = churn(1500, 47)
    vx, vy = churn(500, 48)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 2))
    for m in model:
        if isinstance(m, nn.Linear):
            if fixed:
                nn.init.xavier_uniform_(m.weight)
            else:
                nn.init.zeros_(m.weight)          # "start from a neutral model"
            nn.init.zeros_(m.bias)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("churn_all_weights_zero_init", "mechanics",
     "All Linear weights are initialised with nn.init.zeros_, so every hidden unit of a layer computes the same value "
     "and gets the same gradient: the symmetry is never broken and each layer behaves like a single unit.",
     r"zeros?_?\(|init\.zeros_|(initiali[sz]ed|init) (to|with|at) (all )?zeros?|zero[- ]init|symmetr|(identical|same) (hidden )?"
     r"(units|neurons).{0,60}(same|identical) (gradient|update|value)")(churn_case)
fix("churn_all_weights_zero_init", fixed_of(churn_case), acc, "val accuracy")

# --- 4. air quality: MSELoss(reduction='sum') with an SGD learning rate tuned for the mean -----------------------


def air(fixed=False):
    seed(0)
    x, y = regression(2000, 49)
    vx, vy = regression(500, 50)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(x, y), 128), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.MSELoss(reduction="mean" if fixed else "sum"), max_steps=300)


case("airquality_mse_reduction_sum_sgd", "mechanics",
     "nn.MSELoss(reduction='sum') adds up the batch of 128 squared errors, so with SGD (lr 0.05, tuned for the mean) "
     "every step is 128x too large and the training blows up.",
     r"reduction ?= ?.?sum|reduction.{0,40}(sum|mean)|summ?(ed|ing|s)? (the )?(loss|errors?|over the batch)|"
     r"(scales?|grows?|multipl\w*) (with|by) (the )?batch[ _]size|batch[ _]size (times|x) (too )?(large|big)")(air)
fix("airquality_mse_reduction_sum_sgd", fixed_of(air), rmse, "val RMSE", higher=False)

# --- 5. vibration sensor: F.dropout(..., training=True) hard-coded in forward -------------------------------------


def vibration(n, s):
    g = gen(s)
    protos = torch.randn(3, 20, generator=gen(51))
    y = torch.randint(0, 3, (n,), generator=g)
    return protos[y] * 0.8 + torch.randn(n, 20, generator=g), y


class VibNet(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.l1, self.l2, self.l3 = nn.Linear(20, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        train = self.training if self.fixed else True    # copied from the F.dropout example
        h = F.dropout(F.relu(self.l1(x)), p=0.5, training=train)
        h = F.dropout(F.relu(self.l2(h)), p=0.5, training=train)
        return self.l3(h)


def vib(fixed=False):
    seed(0)
    x, y = vibration(1500, 52)
    vx, vy = vibration(500, 53)
    model = VibNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("vibration_functional_dropout_training_true", "mechanics",
     "forward calls F.dropout(h, p=0.5, training=True), so dropout stays on after model.eval(): evaluation and "
     "inference are computed with half the units randomly dropped (pass training=self.training).",
     r"training ?= ?(true|self\.training)|f\.dropout|functional dropout|dropout.{0,80}(eval|inference|evaluation|model\.eval)|"
     r"(eval|evaluation|inference).{0,80}(dropout|stochastic|random)")(vib)
fix("vibration_functional_dropout_training_true", fixed_of(vib), acc, "val accuracy (eval mode)")
