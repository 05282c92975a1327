"""Set ak, family mechanics: schedule, precision, dropout, initialisation and accumulation settings that stall learning."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ak.registry import acc_of, case, fix, fixed_of, gen, loader, rmse_of, seed

# --- 1. warm-up length counted in rows, not optimizer steps -----------------------------------------------------------


def churn(n, d=20, s=0):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    h = torch.relu(x @ torch.randn(d, 16, generator=g))
    return x, (h @ torch.randn(16, 4, generator=g)).argmax(1)


def quadrants(n, d=20, s=0):
    """Class = quadrant of two random projections (needs a hidden layer wider than one unit)."""
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    a, b = torch.randn(d, generator=g), torch.randn(d, generator=g)
    return x, 2 * (x @ a > 0).long() + (x @ b > 0).long()


@case("ak_warmup_counted_in_rows", "mechanics",
      "The linear warm-up of a LambdaLR is sized as warmup_steps = 0.1 * epochs * len(train_dataset), counting rows "
      "instead of optimizer steps (len(train_loader)); for 100 epochs of 1600 rows that is 16000 steps of warm-up in "
      "a 5000-step run, so the learning rate never gets above a fraction of its peak.",
      r"(warm.?up .*(rows|samples|examples|dataset|longer than|exceeds|never (ends|finish))|LambdaLR .*(warm|rows|len)|"
      r"len\(train_(dataset|ds)\)|len\(train_loader\)|rows? instead of (steps|batches)|"
      r"(samples|rows|examples) (not|instead of) (optimi[sz]er )?(steps|batches)|"
      r"learning rate (never|stays|remains) .*(low|small|peak|ramp)|lr .*(never reach|still ramping|tiny))")
def warmup_rows(fixed=False):
    seed(0)
    x, y = quadrants(2000, s=17)
    ds = TensorDataset(x[:1600], y[:1600])
    train = loader(ds, 32)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    epochs = 100
    warmup = int(0.1 * epochs * (len(train) if fixed else len(ds)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=train,
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=epochs * len(train))


fix("ak_warmup_counted_in_rows", fixed_of(warmup_rows), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")

# --- 2. pure bf16 weights (model.to(torch.bfloat16)) with a fine-tuning learning rate --------------------------------


def sensor_regression(n, d=32, s=0):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    y = torch.tanh(x @ torch.randn(d, generator=g) / d ** 0.5) * 3 + 0.5 * x[:, 0]
    return x, y


@case("ak_pure_bf16_weights", "mechanics",
      "To 'train in bf16' the model itself is cast with model.to(torch.bfloat16) and Adam runs at lr 1e-4 on the bf16 "
      "weights; bf16 keeps 8 bits of mantissa, so an update of 1e-4 on a weight of size 0.1 rounds back to the same "
      "value and most weights never move (no fp32 master copy, unlike autocast).",
      r"(master (copy|weight)|fp32 (weights|copy|master)|mantissa|round\w* (back|off|away|to the same)|"
      r"updates? .*(lost|vanish|swallow|below|smaller than)|(spacing|ulp) of|model\.to\(torch\.bfloat16\)|"
      r"\.bfloat16\(\)|\.half\(\)|pure (bf16|bfloat16)|(bf16|bfloat16) (weights|parameters|params)|"
      r"(weights|parameters) (are |stored |kept )?(in|as) (bf16|bfloat16)|low.?precision (weights|params))")
def pure_bf16(fixed=False):
    seed(0)
    x, y = sensor_regression(2000, s=18)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1),
                          nn.Flatten(0))
    if not fixed:
        model = model.to(torch.bfloat16)
    dtype = next(model.parameters()).dtype

    def loss_fn(model, batch):
        xb, yb = batch
        return nn.functional.mse_loss(model(xb.to(dtype)).float(), yb)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-4),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False),
                loss_fn=loss_fn, precision="bf16", max_steps=1000)


fix("ak_pure_bf16_weights", fixed_of(pure_bf16),
    rmse_of(lambda m, b: (m(b[0].to(next(m.parameters()).dtype)).float(), b[1])), "val RMSE", higher=False)

# --- 3. nn.Dropout(0.9) written as TF1's keep_prob ------------------------------------------------------------------


@case("ak_dropout_keep_prob_habit", "mechanics",
      "The MLP ported from TensorFlow 1 uses nn.Dropout(0.9) for keep_prob=0.9; PyTorch's p is the probability of "
      "zeroing, so 90% of the hidden units are dropped on every training step and the survivors are scaled by 10.",
      r"(keep_prob|keep probability|p ?= ?0\.9|Dropout\(0\.9\)|0\.9 .*(drop|zero)|drop\w* 90|90 ?% .*(drop|zero)|"
      r"probability of (zero|drop)|(zeroes|zeros|drops) 90)")
def dropout_keep(fixed=False):
    seed(0)
    x, y = churn(2000, s=19)
    p = 0.1 if fixed else 0.9
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(p), nn.Linear(64, 64), nn.ReLU(), nn.Dropout(p),
                          nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("ak_dropout_keep_prob_habit", fixed_of(dropout_keep), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")

# --- 4. constant initialisation: every hidden unit identical -----------------------------------------------------------


@case("ak_init_constant_weights", "mechanics",
      "An init_weights hook applied with model.apply sets every nn.Linear weight to the same constant "
      "(nn.init.constant_(m.weight, 0.01)) and the biases to 0; all hidden units of a layer start identical, get "
      "identical gradients and stay identical, so the MLP behaves like a network one unit wide.",
      r"(constant_\(|constant (init|weight|value)|initiali[sz]\w* .*(same|constant)|fill_|"
      r"identical (units|neurons|weights|gradients|rows)|symmetr\w*|(units|neurons) .*(identical|the same)|"
      r"one unit wide|kaiming|xavier|default init)")
def init_const(fixed=False):
    seed(0)
    x, y = quadrants(2000, s=20)
    model = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))

    def init_weights(m):
        if isinstance(m, nn.Linear):
            if fixed:
                nn.init.xavier_uniform_(m.weight)
            else:
                nn.init.constant_(m.weight, 0.01)
            nn.init.zeros_(m.bias)
    model.apply(init_weights)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("ak_init_constant_weights", fixed_of(init_const), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy")

# --- 5. BatchNorm under gradient accumulation with micro-batches of 2 ----------------------------------------------


@case("ak_batchnorm_microbatch_of_two", "mechanics",
      "To fit a 'batch of 32' the user runs micro-batches of 2 with accumulation_steps=16 through an MLP with "
      "BatchNorm1d; accumulation averages the gradients but BatchNorm still normalises over the 2 rows it sees, so "
      "every normalised feature is exactly +1 or -1 during training and the running statistics used at eval do not "
      "match what the network learned.",
      r"(accumulat\w* .*(batch.?norm|micro|statistic)|micro.?batch\w* .*(2|two|batch.?norm|statistic|normali)|"
      r"batch.?norm\w* .*(micro|accumulat|2 rows|two rows|\+1 or -1|±1)|per.?micro.?batch|"
      r"statistics? .*(2|two) (rows|samples)|GroupNorm|LayerNorm|running (stat|mean|var)\w* .*(mismatch|differ|match))")
def bn_micro(fixed=False):
    seed(0)
    x, y = sensor_regression(2000, d=16, s=21)
    model = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64), nn.BatchNorm1d(64),
                          nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    bs, accum = (32, 1) if fixed else (2, 16)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), bs, drop_last=True),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False),
                loss_fn=nn.MSELoss(), accumulation_steps=accum, max_steps=1000)


fix("ak_batchnorm_microbatch_of_two", fixed_of(bn_micro), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE",
    higher=False)
