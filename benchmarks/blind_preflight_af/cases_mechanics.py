"""Mechanics: the optimizer, the schedule, the loss's reduction or a layer setting makes the steps go wrong."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_af.cases_targets import cox_loss, survival_rows
from benchmarks.blind_preflight_af.registry import (
    acc_of,
    case,
    cindex_of,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_of,
    seed,
    teacher_classes,
)


def physics_rows(n, s, d=10):
    """A smooth nonlinear response (a drag-like law) of standardised measurements."""
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    y = torch.tanh(x[:, 0]) * 2 + 0.5 * x[:, 1] * x[:, 2] + torch.sin(x[:, 3]) + 0.05 * torch.randn(n, generator=g)
    return x, y.unsqueeze(1)


# --------------------------------------------------------------------------------------------- keep_prob
@case("af_dropout_keep_prob", "mechanics",
      bug="Ported from TF1, where dropout took keep_prob=0.9, the model uses nn.Dropout(0.9): PyTorch's p is the "
          "probability of ZEROING, so 90% of the hidden units are dropped (and the rest scaled x10) on every training "
          "step and the regressor underfits badly.",
      cause_pattern=r"keep_prob|dropout.{0,60}(0\.9|90 ?%|p\s*=\s*0\.9)|(probability|fraction) of (zero|dropp)\w*.{0,40}"
                    r"(not|rather than|instead of) (keep|retain)|p is the (probability|fraction) of (zero|drop)")
def keep_prob(fixed=False):
    seed(0)
    (x, y), (vx, vy) = physics_rows(3000, 31), physics_rows(1000, 32)
    p = 0.1 if fixed else 0.9
    model = nn.Sequential(nn.Linear(10, 128), nn.ReLU(), nn.Dropout(p), nn.Linear(128, 128), nn.ReLU(), nn.Dropout(p),
                          nn.Linear(128, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 250, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=3000)


fix("af_dropout_keep_prob", fixed_of(keep_prob),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", steps=300, higher=False)


# --------------------------------------------------------------------------------------------- Adam eps
@case("af_adam_eps_one", "mechanics",
      bug="torch.optim.Adam(..., eps=1.0), taken from TensorFlow's note that 1.0 is a good epsilon for Inception on "
          "ImageNet: with gradients far below 1 the denominator sqrt(v) + eps is about 1, so each step is about "
          "lr * gradient, a plain SGD step thousands of times smaller than Adam's, and the classifier barely moves.",
      cause_pattern=r"eps(ilon)?\s*(=|of|is|set to)?\s*1(\.0)?\b|eps(ilon)?.{0,60}(too large|large|dominat|swamp)|"
                    r"sqrt\(v\)\s*\+\s*eps|denominator.{0,40}eps")
def adam_eps(fixed=False):
    seed(0)
    x, y = teacher_classes(4000, 16, 4, s=33)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8 if fixed else 1.0),
                train_loader=loader(TensorDataset(x[:3000], y[:3000]), 64),
                val_loader=loader(TensorDataset(x[3000:], y[3000:]), 250, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=3000)


fix("af_adam_eps_one", fixed_of(adam_eps), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------- warm-up without a cap
@case("af_warmup_lambda_unbounded", "mechanics",
      bug="The warm-up is LambdaLR(optimizer, lambda step: step / warmup_steps) with warmup_steps=10 and no "
          "min(1.0, ...): the factor keeps growing after the warm-up, so by step 300 the learning rate is 30x the "
          "base one and still rising, and training turns unstable.",
      cause_pattern=r"(warm.?up|LambdaLR|lr_lambda).{0,120}(min\(1|never (stops|caps|plateau)|keeps? (grow|increas|ris)|"
                    r"unbounded|no (cap|ceiling|upper bound)|without (a )?(cap|min|clamp))|"
                    r"(factor|multiplier|learning rate|lr).{0,40}(keeps?|continues?) (to )?(grow|increas|ris)\w*|"
                    r"(learning rate|lr).{0,40}\d+x (the )?(base|initial)")
def warmup_unbounded(fixed=False):
    seed(0)
    (x, y), (vx, vy) = physics_rows(3000, 35), physics_rows(1000, 36)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    warmup_steps = 10
    lam = (lambda step: min(1.0, step / warmup_steps)) if fixed else (lambda step: step / warmup_steps)
    return dict(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lam),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 250, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=2000)


fix("af_warmup_lambda_unbounded", fixed_of(warmup_unbounded),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", steps=300, higher=False)


# --------------------------------------------------------------------------------------------- reduction="sum"
@case("af_sum_reduction_sgd", "mechanics",
      bug="nn.MSELoss(reduction='sum') with SGD(lr=0.01, momentum=0.9) tuned for a mean loss: the summed loss's "
          "gradient is batch_size (128) times larger, an effective learning rate of 1.28, and the regression diverges "
          "(under Adam the scale would cancel; under SGD it does not).",
      cause_pattern=r"reduction\s*=?\s*.?sum|summed (loss|over the batch)|sum(s|med)? (over|across) the batch|"
                    r"(loss|gradient).{0,40}(scales?|grows?) with (the )?batch.?size|"
                    r"batch.?size (times|x) (larger|bigger)|effective (learning rate|lr).{0,30}batch")
def sum_reduction(fixed=False):
    seed(0)
    (x, y), (vx, vy) = physics_rows(3000, 37), physics_rows(1000, 38)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                train_loader=loader(TensorDataset(x, y), 128), val_loader=loader(TensorDataset(vx, vy), 250, shuffle=False),
                loss_fn=nn.MSELoss(reduction="mean" if fixed else "sum"), max_steps=2000)


fix("af_sum_reduction_sgd", fixed_of(sum_reduction),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", steps=300, higher=False)


# --------------------------------------------------------------------------------------------- Cox without sorting
@case("af_cox_loss_unsorted", "mechanics",
      bug="The Cox partial likelihood uses torch.logcumsumexp(risk, 0) as each subject's risk set, which is right only "
          "when the batch is sorted by time, longest first (as in the DeepSurv code it was copied from); the "
          "DataLoader shuffles, so each 'risk set' is a random subset of the batch and the loss ranks almost nothing.",
      cause_pattern=r"(sort|order)\w*.{0,60}(by|on) (survival |event |observed )?time|descending|"
                    r"risk.?sets?.{0,80}(random|unsorted|shuffl|order)|"
                    r"(cumsum|logcumsumexp|cumulative sum).{0,80}(sort|order|shuffl)|argsort\(.{0,20}time")
def cox_unsorted(fixed=False):
    seed(0)
    x, t, c = survival_rows(3000, 39, censoring=0.002)
    vx, vt, vc = survival_rows(600, 40, censoring=0.002)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))

    def cox_ph(model, batch):
        x, time, censored = batch
        risk, event = model(x).squeeze(-1), 1.0 - censored
        if fixed:
            return cox_loss(risk, time, event)
        return -((risk - torch.logcumsumexp(risk, 0)) * event).sum() / event.sum().clamp_min(1.0)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, t, c), 128),
                val_loader=loader(TensorDataset(vx, vt, vc), 600, shuffle=False), loss_fn=cox_ph, max_steps=1000)


fix("af_cox_loss_unsorted", fixed_of(cox_unsorted),
    cindex_of(lambda m, b: (m(b[0]).squeeze(-1), torch.stack([b[1], 1.0 - b[2]], 1))), "val C-index", steps=300)
