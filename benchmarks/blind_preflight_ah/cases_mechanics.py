"""Mechanics: the update rule itself is broken (schedule, learning rate, precision of the weights, normalisation
under accumulation, initialisation)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ah.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

_argmax_acc = acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))


def tabular_classes(n: int, s: int, d: int = 16, c: int = 4, teacher: int = 500):
    """A learnable nonlinear tabular task: 4 classes from a random 2-layer teacher."""
    g = gen(teacher)
    w1, w2 = torch.randn(d, 32, generator=g), torch.randn(32, c, generator=g)
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    return x, (torch.tanh(x @ w1 / d ** 0.5) @ w2).argmax(1)


def mlp(d=16, hidden=64, out=4):
    return nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out))

# --------------------------------------------------------------------------------------------------------------
# Insurance claim regression: a LambdaLR whose lambda returns the learning rate itself, not a factor.


def claims(n: int, s: int, d: int = 12):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=gen(501)) / d ** 0.5
    return x, (torch.tanh(x @ w) * 2 + 0.6 * x[:, 0] * x[:, 1] + 0.1 * torch.randn(n, generator=g)).unsqueeze(1)


def lambdalr_absolute(fixed: bool = False):
    seed(0)
    x, y = claims(2000, 502)
    xv, yv = claims(600, 503)
    model = mlp(12, 64, 1)
    base_lr = 2e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=base_lr)
    def schedule(step):
        if fixed:
            return 0.999 ** step                    # a factor of the base lr
        return base_lr * 0.999 ** step              # "the learning rate at this step"
    return dict(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, schedule),
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 600, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=3000)


case("ah_lambdalr_returns_lr_not_factor", "mechanics",
     "The LambdaLR lambda returns the learning rate itself (base_lr * 0.999 ** step) instead of a multiplicative "
     "factor, so LambdaLR multiplies base_lr = 2e-3 by it and the optimizer runs at 4e-6 from the first step: "
     "500x too small, the model barely moves.",
     r"lambdalr|lr_lambda|(multiplicative )?factor.{0,60}(base|initial) (lr|learning rate)|"
     r"(lr|learning rate).{0,40}(squared|multiplied twice|applied twice|multiplied by itself)|"
     r"\b4(\.0+)?e-0?6\b|0\.000004\b|\b500 ?x\b|scheduler.{0,60}(returns?|lambda).{0,60}(lr|"
     r"learning rate)")(lambdalr_absolute)

# --------------------------------------------------------------------------------------------------------------
# Fashion-tile classification: the optimizer was switched from Adadelta to Adam but the --lr 1.0 default of the
# Adadelta example stayed.


def adam_lr_one(fixed: bool = False):
    seed(0)
    x, y = tabular_classes(2000, 504)
    xv, yv = tabular_classes(800, 505)
    model = mlp()
    lr = 1e-3 if fixed else 1.0          # args.lr default of the Adadelta MNIST example
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=lr),
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


case("ah_adam_with_adadelta_lr_1", "mechanics",
     "Adam is run with lr=1.0, the default learning rate of the Adadelta example it replaced: every step moves each "
     "weight by about 1.0, the loss jumps to hundreds or thousands within the first steps and then stalls at chance "
     "level (ln 4 = 1.39) instead of converging (Adam wants about 1e-3).",
     r"(lr|learning rate)\b\W{0,3}(= ?|of |is |at )?1(\.0)?\b|adadelta|1\.0 (lr|learning rate)|"
     r"(lr|learning rate).{0,60}1000 ?x|dead (relu|units|neurons)")(adam_lr_one)

# --------------------------------------------------------------------------------------------------------------
# Ticket-priority classifier "trained in bf16": model.to(torch.bfloat16), so the weights themselves are bf16 and
# AdamW's small updates are rounded away.


class BF16Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, x):
        return self.net(x.to(self.net[0].weight.dtype))


def pure_bf16(fixed: bool = False):
    seed(0)
    x, y = tabular_classes(2000, 506)
    xv, yv = tabular_classes(800, 507)
    model = BF16Net()
    if not fixed:
        model = model.to(torch.bfloat16)          # "bf16 training"
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.0),
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), precision="bf16", max_steps=3000)


case("ah_weights_cast_to_bf16", "mechanics",
     "The model is cast with model.to(torch.bfloat16), so the parameters AdamW updates are stored in bfloat16 (8 "
     "significant bits): an update of lr = 2e-4 is below half the spacing between bf16 numbers near a typical weight "
     "of 0.1 (about 2.4e-4), most updates round back to the old value and training stalls; bf16 belongs in autocast, "
     "with fp32 master weights.",
     r"bfloat16|bf16.{0,60}(weights?|param|master|storage|stored)|(weights?|param\w*).{0,60}(bf16|half|fp16|"
     r"low precision)|"
     r"(fp32|float32|full precision) (master )?(weights|copy|parameters)|master weights|"
     r"(updates?|steps?).{0,60}(\b(rounded|rounding|lost|swallowed|vanish\w*|absorbed)\b|below.{0,20}(precision|"
     r"resolution|spacing|ulp))|\b(rounded|rounding|swallowed|absorbed)\b.{0,40}(updates?|steps?)|"
     r"\.to\(torch\.(bfloat16|float16)\)|\.half\(\)")(pure_bf16)

# --------------------------------------------------------------------------------------------------------------
# Sensor fault detection: micro-batches of 2 with 16-step gradient accumulation through BatchNorm1d layers.


class FaultNet(nn.Module):
    def __init__(self, fixed=False, d=16, hidden=64):
        super().__init__()
        norm = (lambda: nn.LayerNorm(hidden)) if fixed else (lambda: nn.BatchNorm1d(hidden))
        self.net = nn.Sequential(nn.Linear(d, hidden), norm(), nn.ReLU(), nn.Linear(hidden, hidden), norm(), nn.ReLU(),
                                 nn.Linear(hidden, 4))

    def forward(self, x):
        return self.net(x)


def fault_data(n, s):
    x, y = tabular_classes(n, s, teacher=508)
    scale = torch.linspace(0.5, 3.0, 16)
    return x * scale + 1.5, y          # raw sensor units, not centred


def bn_micro_batches(fixed: bool = False):
    seed(0)
    x, y = fault_data(2048, 509)
    xv, yv = fault_data(800, 510)
    model = FaultNet(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 2, drop_last=True),
                val_loader=loader(TensorDataset(xv, yv), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), accumulation_steps=16, max_steps=2000)


case("ah_batchnorm_with_micro_batches_of_2", "mechanics",
     "The data loader yields micro-batches of 2 and the step accumulates 16 of them, but the model normalises with "
     "BatchNorm1d: every BatchNorm sees batch statistics of 2 samples (each feature becomes about +-1 whatever its "
     "value), and the running statistics used at evaluation do not match what the layers were trained on.",
     r"batch ?norm.{0,80}(micro|accumulat)|micro[- ]?batch.{0,80}batch ?norm|accumulat.{0,80}batch ?norm|"
     r"running (stat|mean|var)|(group|layer|instance) ?norm")(bn_micro_batches)

# --------------------------------------------------------------------------------------------------------------
# Loan default classifier whose init_weights() zeroes every weight and bias ("start from a neutral model").


def zero_init(fixed: bool = False):
    seed(0)
    x, y = tabular_classes(2000, 511)
    xv, yv = tabular_classes(800, 512)
    model = mlp()
    if not fixed:
        def init_weights(m):
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.weight)
                nn.init.zeros_(m.bias)
        model.apply(init_weights)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


case("ah_all_weights_zero_initialised", "mechanics",
     "init_weights() sets every Linear weight and bias to zero: all hidden units compute the same value (0), get the "
     "same (zero) gradient and stay identical, so no symmetry is ever broken and only the output bias learns the class "
     "prior.",
     r"zero[- ]?(init|initiali[sz]\w*)|initiali[sz]\w*.{0,40}(zero|constant|identical)|(weights?|parameters?).{0,40}"
     r"(all )?(zero|zeros|0\.0|constant|identical)\b|symmetr|(hidden )?units.{0,40}(identical|the same)|"
     r"nn\.init\.(zeros_|constant_)")(zero_init)

# --------------------------------------------------------------------------------------------------------------
# The one-line fixes verify.py trains next to each case, and the metric both are scored on.

fix("ah_lambdalr_returns_lr_not_factor", fixed_of(lambdalr_absolute), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE",
    higher=False)
fix("ah_adam_with_adadelta_lr_1", fixed_of(adam_lr_one), _argmax_acc, "val accuracy")
fix("ah_weights_cast_to_bf16", fixed_of(pure_bf16), _argmax_acc, "val accuracy")
fix("ah_batchnorm_with_micro_batches_of_2", fixed_of(bn_micro_batches), _argmax_acc, "val accuracy", steps=100)
fix("ah_all_weights_zero_initialised", fixed_of(zero_init), _argmax_acc, "val accuracy")
