"""Set am, family mechanics: precision, accumulation, schedules, normalisation statistics and loss reduction."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_am.registry import case, fix, fixed_of, gen, loader, rmse_of, seed

# ---------------------------------------------------------------------------------------------------------------


def grid_load(n: int, s: int):
    """Regional grid load in MW: about 5000 MW with a 30 MW weather-driven swing."""
    g = gen(s)
    x = torch.randn(n, 6, generator=g)
    y = 5000.0 + 30.0 * (torch.tanh(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2]) + 1.0 * torch.randn(n, generator=g)
    return x, y


class LoadNet(nn.Module):
    def __init__(self, mean: float):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 1)
        nn.init.constant_(self.head.bias, mean)           # start at the mean load, as the tutorial advises

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


@case("am_bf16_large_offset_target", "mechanics",
      "The grid-load regressor predicts raw megawatts (about 5000 MW, swing of 30 MW) and trains with "
      "precision='bf16': the head's output is produced in bfloat16, whose spacing at 5000 is 32, so predictions and "
      "the MSE residuals are rounded to 32 MW steps, as large as the whole signal.",
      r"(bf16|bfloat16).{0,160}(spacing|mantissa|8.bit|round\w* to (multiples|steps) of|\b32\b|5000|megawatt|MW\b|"
      r"offset|resolution)|(spacing|mantissa|resolution|round\w* to).{0,80}(bf16|bfloat16)|(keep|run|compute|cast) "
      r"the (head|output layer|last layer|regression head|output).{0,30}(fp32|float32)|precision\s*=\s*.?fp32")
def bf16_large_offset_target(fixed: bool = False):
    seed(0)
    x, y = grid_load(3000, 31)
    model = LoadNet(float(y[:2500].mean()))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 64),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 500, shuffle=False),
                loss_fn=nn.MSELoss(), precision="fp32" if fixed else "bf16", max_steps=600)


def rmse_under_precision(model, kw):
    import contextlib

    ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if kw.get("precision") == "bf16"
           else contextlib.nullcontext())
    with ctx:
        return rmse_of(lambda m, b: (m(b[0]).float(), b[1]))(model, kw)


fix("am_bf16_large_offset_target", fixed_of(bf16_large_offset_target), rmse_under_precision,
    "val RMSE in MW (each run's own precision)", higher=False)

# ---------------------------------------------------------------------------------------------------------------

ACCUM = 8


def demand(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    w = torch.randn(10, generator=g) / 10 ** 0.5
    y = torch.tanh(x @ w) * 2 + 0.5 * x[:, 0] * x[:, 1] + 0.1 * torch.randn(n, generator=g)
    return x, y


def mse_per_window(fixed: bool):
    def loss(model, batch):
        x, y = batch
        value = ((model(x) - y) ** 2).mean()
        return value if fixed else value / ACCUM          # copied from the hand-written accumulation loop
    return loss


@case("am_loss_divided_twice_accum", "mechanics",
      "The loss function divides by the accumulation steps (loss / 8, copied from a hand-written accumulation loop) "
      "while accumulation_steps=8 is also passed to the training loop, which divides again: with plain SGD the "
      "gradients are 8x too small, an effective learning rate of lr / 8.",
      r"(divid\w*|scal\w*|normali[sz]\w*).{0,120}(twice|two times|double|again|already)|"
      r"(twice|double).{0,80}(divid|scal|normali[sz])\w*|accumulation.{0,120}(loss ?/ ?(8|accum\w*|k)|"
      r"1 ?/ ?(8|k)|8x|too small|lr ?/ ?8)|loss ?/ ?(accum\w*|8)")
def loss_divided_twice_accum(fixed: bool = False):
    seed(0)
    x, y = demand(4000, 32)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                train_loader=loader(TensorDataset(x[:3500], y[:3500]), 32),
                val_loader=loader(TensorDataset(x[3500:], y[3500:]), 500, shuffle=False),
                loss_fn=mse_per_window(fixed), accumulation_steps=ACCUM, max_steps=300)


fix("am_loss_divided_twice_accum", fixed_of(loss_divided_twice_accum), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False, steps=150)

# ---------------------------------------------------------------------------------------------------------------


@case("am_lambdalr_returns_lr", "mechanics",
      "The warm-up LambdaLR's lambda returns the learning rate itself (3e-3 * min(1, step / 50)) rather than a "
      "multiplicative factor; LambdaLR multiplies it by the optimizer's base lr 3e-3, so the run trains at about 9e-6.",
      r"LambdaLR|lr_lambda|(lambda|schedule\w*).{0,100}(factor|multipl\w*|absolute|the (learning rate|lr) itself)|"
      r"(lr|learning rate).{0,60}(squared|9e-6|9\.0?e-06|tiny|multiplied twice)|"
      r"(factor|multiplier).{0,60}(not|instead of|rather than).{0,20}(lr|learning rate)")
def lambdalr_returns_lr(fixed: bool = False):
    seed(0)
    x, y = demand(4000, 33)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1),
                          nn.Flatten(0))
    base = 3e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=base)
    if fixed:
        schedule = lambda step: min(1.0, (step + 1) / 50)          # noqa: E731
    else:
        schedule = lambda step: base * min(1.0, (step + 1) / 50)   # noqa: E731
    return dict(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, schedule),
                train_loader=loader(TensorDataset(x[:3500], y[:3500]), 64),
                val_loader=loader(TensorDataset(x[3500:], y[3500:]), 500, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=600)


fix("am_lambdalr_returns_lr", fixed_of(lambdalr_returns_lr), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False)

# ---------------------------------------------------------------------------------------------------------------


def skewed_tabular(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    x[:, :4] = torch.exp(x[:, :4])                        # log-normal amounts, unscaled
    y = torch.log1p(x[:, 0]) - 0.5 * torch.log1p(x[:, 1]) + 0.3 * x[:, 4] + 0.05 * torch.randn(n, generator=g)
    return x, y


@case("am_bn_keras_momentum", "mechanics",
      "BatchNorm1d(64, momentum=0.99) is ported from Keras, where momentum is the weight of the old running "
      "average; in PyTorch it is the weight of the new batch, so the running mean and variance are essentially the "
      "last batch's statistics and the model evaluates with noisy normalisation.",
      r"momentum\s*=\s*0?\.99|(BatchNorm|batch.?norm|BN)\w*.{0,160}(momentum|running (mean|stat|var)\w*.{0,60}"
      r"(last|single|one|noisy) batch)|(keras|tensorflow|tf)\w*.{0,80}momentum|momentum.{0,80}(keras|tensorflow|"
      r"convention|1 ?- ?momentum|revers|invert)")
def bn_keras_momentum(fixed: bool = False):
    seed(0)
    x, y = skewed_tabular(3000, 34)
    model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64, momentum=0.01 if fixed else 0.99), nn.ReLU(),
                          nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 16),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 500, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=600)


fix("am_bn_keras_momentum", fixed_of(bn_keras_momentum), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE (eval mode, running statistics)", higher=False, steps=400)

# ---------------------------------------------------------------------------------------------------------------


@case("am_sum_reduction_sgd", "mechanics",
      "nn.MSELoss(reduction='sum') over batches of 256 with SGD(lr=0.01), a learning rate tuned for the mean: the "
      "gradient is 256x larger than with the mean, an effective step of 2.56 per unit of mean loss, and the "
      "regression diverges.",
      r"reduction\s*=\s*.?sum|sum(med)? (reduction|over the batch|of (the )?(per.sample )?loss)|"
      r"(loss|gradient)\w*.{0,80}(scales?|grows?|proportional) (with|to) (the )?batch.size|"
      r"reduction\s*=\s*.?mean|256x")
def sum_reduction_sgd(fixed: bool = False):
    seed(0)
    x, y = demand(4000, 35)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                train_loader=loader(TensorDataset(x[:3500], y[:3500]), 256),
                val_loader=loader(TensorDataset(x[3500:], y[3500:]), 500, shuffle=False),
                loss_fn=nn.MSELoss(reduction="mean" if fixed else "sum"), max_steps=300)


fix("am_sum_reduction_sgd", fixed_of(sum_reduction_sgd), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False)
