"""Mechanics: KL reduction, ramp-up weights, focal modulating factor, schedulers and EMA decay."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight.fixes import val_acc
from benchmarks.blind_preflight_au.registry import (
    FIX_TABLE,
    balanced_acc,
    blobs,
    case,
    fixed_of,
    gen,
    loader,
    mlp,
    oracle_teacher,
    seed,
)


def transfer_set(n, d, teacher, s):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    with torch.no_grad():
        y = teacher(x).argmax(1)
    return x, y


# 1. KLDivLoss reduction='mean' over 50 classes with SGD
@case("kd_kldiv_reduction_mean", "mechanics",
      "The distillation loss is nn.KLDivLoss() with its default reduction='mean', which averages over the 50 "
      "classes as well as the batch, so the KL term (and with SGD the step) is 50 times too small; "
      "reduction='batchmean' gives the real KL divergence.",
      r"batchmean|reduction\s*=\s*.?mean|(averag|divid)\w* (over|by) (the )?(classes|number of classes|elements|"
      r"numel)|KLDivLoss.*(mean|reduction)")
def kd_kldiv_reduction_mean(fixed=False):
    seed(50)
    teacher = oracle_teacher(20, 50, s=51, scale=4.0)
    x, y = transfer_set(2600, 20, teacher, 52)
    model = mlp(20, 50, hidden=128)
    kl = nn.KLDivLoss(reduction="batchmean") if fixed else nn.KLDivLoss()
    temp = 2.0

    def kd(model, batch):
        xb, _ = batch
        with torch.no_grad():
            t = teacher(xb)
        return kl(F.log_softmax(model(xb) / temp, 1), F.softmax(t / temp, 1)) * temp ** 2

    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                train_loader=loader(TensorDataset(x[:2200], y[:2200]), 64),
                val_loader=loader(TensorDataset(x[2200:], y[2200:]), 200, shuffle=False),
                loss_fn=kd, max_steps=300)


FIX_TABLE.fix("kd_kldiv_reduction_mean", fixed_of(kd_kldiv_reduction_mean), val_acc, "val acc vs teacher")


# 2. distillation ramp-up length copied in epochs from a long schedule
class RampedDistill:
    """sup CE + w(epoch) * KD on unlabelled rows; w = exp(-5 (1 - epoch / rampup)^2), the usual sigmoid ramp-up."""

    def __init__(self, teacher, steps_per_epoch, rampup_epochs):
        self.teacher, self.spe, self.rampup, self.calls = teacher, steps_per_epoch, rampup_epochs, 0

    def weight(self):
        t = min(self.calls / self.spe / self.rampup, 1.0)
        return math.exp(-5 * (1 - t) ** 2)

    def __call__(self, model, batch):
        xl, yl, xu = batch
        self.calls += 1
        with torch.no_grad():
            t = self.teacher(xu)
        kd = F.kl_div(F.log_softmax(model(xu), 1), F.softmax(t, 1), reduction="batchmean")
        return F.cross_entropy(model(xl), yl) + self.weight() * kd


@case("kd_rampup_never_ramps", "mechanics",
      "The unlabelled distillation weight follows a sigmoid ramp-up of 80 epochs copied from a long schedule, but "
      "this run lasts about 7 epochs, so the weight stays below 0.02 and the teacher's signal is effectively off.",
      r"ramp-?up|warm-?up.*(weight|lambda|coefficient)|(weight|lambda|coefficient).*(stays|remains|near) "
      r"(zero|0|small)|consistency weight|unsup\w* weight")
def kd_rampup_never_ramps(fixed=False):
    seed(53)
    teacher = oracle_teacher(16, 5, s=54)
    x, y = transfer_set(3400, 16, teacher, 55)
    idx = torch.arange(2800) % 40
    model = mlp(16, 5)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TensorDataset(x[:40][idx], y[:40][idx], x[40:2840]), 64),
                val_loader=loader(TensorDataset(x[2840:], y[2840:]), 280, shuffle=False),
                loss_fn=RampedDistill(teacher, 44, 1 if fixed else 80), max_steps=300)


FIX_TABLE.fix("kd_rampup_never_ramps", fixed_of(kd_rampup_never_ramps), val_acc, "val acc")


# 3. focal loss with p_t taken from the predicted class instead of the target class
@case("focal_pt_from_max", "mechanics",
      "The multi-class focal loss takes p_t = softmax(logits).max(1) (the predicted class's probability) instead "
      "of gathering the target class's probability, so confidently wrong minority examples get a modulating "
      "factor near zero.",
      r"\.max\(|gather|p_?t.*(target|true|label) class|(predicted|max(imum)?) (class|probability).*(instead|not)|"
      r"modulating factor|confidently wrong")
def focal_pt_from_max(fixed=False):
    seed(56)
    x, y = blobs(4000, 8, [0.8, 0.15, 0.05], sep=0.7, s=57)
    model = mlp(8, 3)
    alpha = torch.tensor([0.2, 1.0, 2.0])

    def focal(model, batch, gamma=2.0):
        xb, yb = batch
        logp = F.log_softmax(model(xb), 1)
        logpt = logp.gather(1, yb.unsqueeze(1)).squeeze(1)
        pt = logpt.exp() if fixed else logp.exp().max(1).values
        return (-(alpha.to(xb.device)[yb]) * (1 - pt) ** gamma * logpt).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TensorDataset(x[:3200], y[:3200]), 64),
                val_loader=loader(TensorDataset(x[3200:], y[3200:]), 200, shuffle=False),
                loss_fn=focal, max_steps=300)


FIX_TABLE.fix("focal_pt_from_max", fixed_of(focal_pt_from_max), balanced_acc, "val balanced acc")


# 4. per-epoch exponential decay stepped per batch (generic)
@case("exp_lr_per_batch", "mechanics",
      "A LambdaLR written as 0.95 ** epoch is stepped after every batch (the loop steps the scheduler per "
      "optimizer step), so after 100 steps the learning rate is below 1% of its start and the classifier stops "
      "learning.",
      r"(scheduler|LambdaLR|lr_lambda).*(per (batch|step|iteration)|every (batch|step))|(per|every) (batch|step).*"
      r"(scheduler|decay)|epoch.*(batch|step)|learning rate.*(decay|near zero|vanish|collaps|too fast|tiny)|"
      r"lr (decays?|collaps|vanish|→|->)")
def exp_lr_per_batch(fixed=False):
    seed(58)
    x, y = blobs(4000, 12, [0.3, 0.25, 0.2, 0.15, 0.1], sep=0.6, s=59)
    model = mlp(12, 5)
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)
    steps_per_epoch = 50
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, (lambda step: 0.95 ** (step // steps_per_epoch)) if fixed else (lambda epoch: 0.95 ** epoch))
    return dict(model=model, optimizer=opt, scheduler=sched,
                train_loader=loader(TensorDataset(x[:3200], y[:3200]), 64),
                val_loader=loader(TensorDataset(x[3200:], y[3200:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


FIX_TABLE.fix("exp_lr_per_batch", fixed_of(exp_lr_per_batch), balanced_acc, "val balanced acc")


# 5. mean teacher EMA decay far too high for the run
class MeanTeacher(nn.Module):
    def __init__(self, student, decay):
        super().__init__()
        self.student = student
        self.ema = copy.deepcopy(student).requires_grad_(False)
        self.decay = decay

    @torch.no_grad()
    def update_ema(self):
        for e, p in zip(self.ema.parameters(), self.student.parameters()):
            e.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)

    def forward(self, x):                    # deployed / evaluated model: the EMA teacher
        return self.student(x) if self.training else self.ema(x)


@case("mean_teacher_ema_decay_too_high", "mechanics",
      "The mean-teacher EMA decay is 0.9999 in a 300-step run, so the teacher that is evaluated and that provides "
      "the consistency targets stays about 97% its random initialisation.",
      r"ema.*(decay|momentum).*(too (high|large|close)|0\.9999)|0\.9999|(decay|momentum).*(too (high|large)|"
      r"run length|number of steps)|teacher (barely|hardly|never) (moves|changes|updat)|initiali[sz]ation")
def mean_teacher_ema_decay_too_high(fixed=False):
    seed(60)
    x, y = blobs(4400, 10, [0.25] * 4, sep=0.8, s=61)
    xl, yl = x[:200], y[:200]
    idx = torch.arange(3000) % 200
    xu = x[200:3200]
    model = MeanTeacher(mlp(10, 4), 0.99 if fixed else 0.9999)

    def loss(model, batch):
        xb_l, yb_l, xb_u = batch
        sup = F.cross_entropy(model.student(xb_l), yb_l)
        noisy = xb_u + 0.3 * torch.randn_like(xb_u)
        with torch.no_grad():
            target = F.softmax(model.ema(xb_u), 1)
        cons = F.mse_loss(F.softmax(model.student(noisy), 1), target)
        model.update_ema()
        return sup + 5.0 * cons

    return dict(model=model, optimizer=torch.optim.Adam(model.student.parameters(), 3e-3),
                train_loader=loader(TensorDataset(xl[idx], yl[idx], xu), 64),
                val_loader=loader(TensorDataset(x[3200:], y[3200:]), 200, shuffle=False),
                loss_fn=loss, max_steps=300)


FIX_TABLE.fix("mean_teacher_ema_decay_too_high", fixed_of(mean_teacher_ema_decay_too_high), val_acc,
              "val acc of the EMA teacher")
