"""Healthy: five corrected twins and five unusual-but-correct distillation / SSL / imbalance setups."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_au.cases_data import sampler_weights_counts_not_inverse
from benchmarks.blind_preflight_au.cases_mechanics import kd_kldiv_reduction_mean
from benchmarks.blind_preflight_au.cases_targets import class_weights_counter_order
from benchmarks.blind_preflight_au.cases_trained import ordinal_cutpoints_plain_tensor, ssl_student_forward_in_no_grad
from benchmarks.blind_preflight_au.registry import blobs, gen, healthy, loader, mlp, oracle_teacher, seed, twin

healthy("kd_kldiv_reduction_mean_fixed", "KD with KLDivLoss(reduction='batchmean') and SGD.")(
    twin(kd_kldiv_reduction_mean))
healthy("class_weights_counter_order_fixed", "Class weights indexed by class id from the Counter.")(
    twin(class_weights_counter_order))
healthy("sampler_weights_counts_not_inverse_fixed", "WeightedRandomSampler with 1/count per sample.")(
    twin(sampler_weights_counts_not_inverse))
healthy("ordinal_cutpoints_plain_tensor_fixed", "Cumulative-link head with cut-points as nn.Parameter.")(
    twin(ordinal_cutpoints_plain_tensor))
healthy("ssl_student_forward_in_no_grad_fixed", "Teacher under no_grad, student forward outside it.")(
    twin(ssl_student_forward_in_no_grad))


class FrozenTeacherKD(nn.Module):
    """Student plus a frozen teacher kept in eval mode whatever train() is called with."""

    def __init__(self, student, teacher):
        super().__init__()
        self.student, self.teacher = student, teacher.requires_grad_(False)

    def train(self, mode=True):
        super().train(mode)
        self.teacher.eval()
        return self

    def forward(self, x):
        return self.student(x)


@healthy("kd_hard_soft_bf16", "Hinton KD: frozen eval-mode teacher with dropout, T=4 with T^2 scaling, alpha mix "
         "of KL(batchmean) and hard CE, bf16.")
def kd_hard_soft_bf16():
    seed(90)
    teacher = nn.Sequential(oracle_teacher(12, 6, s=91), nn.Dropout(0.3))
    g = gen(92)
    x = torch.randn(2400, 12, generator=g)
    with torch.no_grad():
        y = teacher.eval()(x).argmax(1)
    model = FrozenTeacherKD(mlp(12, 6), teacher)
    temp, alpha = 4.0, 0.7

    def loss(model, batch):
        xb, yb = batch
        with torch.no_grad():
            t = model.teacher(xb)
        s = model.student(xb)
        kd = F.kl_div(F.log_softmax(s.float() / temp, 1), F.softmax(t.float() / temp, 1), reduction="batchmean")
        return alpha * kd * temp ** 2 + (1 - alpha) * F.cross_entropy(s.float(), yb)

    return dict(model=model, optimizer=torch.optim.AdamW(model.student.parameters(), 3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=loss, max_steps=200, precision="bf16")


@healthy("fixmatch_threshold_accum", "FixMatch: labelled and unlabelled rows in one batch, thresholded pseudo-labels "
         "from the weak view (no grad) trained on the strong view, 2-step accumulation.")
def fixmatch_threshold_accum():
    seed(93)
    x, y = blobs(4300, 10, [0.25] * 4, sep=0.9, s=94)
    g = gen(95)
    xu = x[200:4200]
    weak = xu + 0.1 * torch.randn(xu.shape, generator=g)
    strong = xu + 0.5 * torch.randn(xu.shape, generator=g)
    idx = torch.arange(4000) % 200
    model = mlp(10, 4)

    def loss(model, batch):
        xl, yl, w, s = batch
        logits = model(torch.cat([xl, w, s]))
        n = len(xl)
        lx, lw, ls = logits[:n], logits[n:2 * n], logits[2 * n:]
        conf, pseudo = F.softmax(lw.detach(), 1).max(1)
        unsup = (F.cross_entropy(ls, pseudo, reduction="none") * (conf > 0.95).float()).mean()
        return F.cross_entropy(lx, yl) + unsup

    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), 0.03, momentum=0.9, nesterov=True),
                train_loader=loader(TensorDataset(x[:200][idx], y[:200][idx], weak, strong), 32),
                val_loader=loader(TensorDataset(x[4200:], y[4200:]), 100, shuffle=False),
                loss_fn=loss, max_steps=200, accumulation_steps=2)


@healthy("multilabel_focal_pos_weight_cosine", "Multi-label findings with a sigmoid focal loss, per-label "
         "pos_weight and a cosine schedule sized for max_steps.")
def multilabel_focal_pos_weight_cosine():
    seed(96)
    g = gen(97)
    x = torch.randn(2400, 16, generator=g)
    w = torch.randn(16, 5, generator=g)
    y = (x @ w > torch.tensor([1.5, 2.0, 2.5, 3.0, 3.5])).float()
    pos = y[:2000].mean(0).clamp_min(1e-3)
    pos_weight = ((1 - pos) / pos).sqrt()
    model = mlp(16, 5)

    def focal(model, batch, gamma=1.5):
        xb, yb = batch
        logits = model(xb)
        bce = F.binary_cross_entropy_with_logits(logits, yb, pos_weight=pos_weight.to(xb.device), reduction="none")
        p = torch.sigmoid(logits)
        pt = torch.where(yb > 0, p, 1 - p)
        return ((1 - pt) ** gamma * bce).mean()

    opt = torch.optim.Adam(model.parameters(), 3e-3)
    return dict(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=200),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=focal, max_steps=200)


class Coral(nn.Module):
    """CORAL: one shared score and K-1 learned biases (rank-consistent ordinal head)."""

    def __init__(self, d, k):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, 32), nn.ReLU())
        self.score = nn.Linear(32, 1, bias=False)
        self.bias = nn.Parameter(torch.linspace(1, -1, k - 1))

    def forward(self, x):
        return self.score(self.body(x)) + self.bias


@healthy("coral_ordinal_clipped", "CORAL ordinal head (shared weight, K-1 biases) on cumulative y > k targets, "
         "gradient clipping.")
def coral_ordinal_clipped():
    seed(98)
    g = gen(99)
    x = torch.randn(2400, 10, generator=g)
    w = torch.randn(10, generator=g)
    y = torch.bucketize(x @ w / 10 ** 0.5, torch.tensor([-1.0, -0.3, 0.3, 1.0]))
    model = Coral(10, 5)

    def loss(model, batch):
        xb, yb = batch
        levels = (yb.unsqueeze(1) > torch.arange(4, device=yb.device)).float()
        return F.binary_cross_entropy_with_logits(model(xb), levels)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=loss, max_steps=200, clip_grad_norm=1.0)


class MeanTeacher(nn.Module):
    def __init__(self, student, decay=0.99):
        super().__init__()
        self.student, self.decay = student, decay
        self.ema = copy.deepcopy(student).requires_grad_(False)

    @torch.no_grad()
    def update_ema(self):
        for e, p in zip(self.ema.parameters(), self.student.parameters()):
            e.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)

    def forward(self, x):
        return self.student(x) if self.training else self.ema(x)


@healthy("mean_teacher_onecycle", "Mean teacher: EMA decay 0.99, softmax-MSE consistency on noisy unlabelled rows, "
         "OneCycleLR sized for max_steps, clipping.")
def mean_teacher_onecycle():
    seed(100)
    x, y = blobs(4400, 10, [0.25] * 4, sep=0.8, s=101)
    idx = torch.arange(3000) % 200
    model = MeanTeacher(mlp(10, 4))

    def loss(model, batch):
        xl, yl, xu = batch
        with torch.no_grad():
            target = F.softmax(model.ema(xu), 1)
        cons = F.mse_loss(F.softmax(model.student(xu + 0.3 * torch.randn_like(xu)), 1), target)
        model.update_ema()
        return F.cross_entropy(model.student(xl), yl) + 5.0 * cons

    opt = torch.optim.Adam(model.student.parameters(), 3e-3)
    return dict(model=model, optimizer=opt,
                scheduler=torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=200),
                train_loader=loader(TensorDataset(x[:200][idx], y[:200][idx], x[200:3200]), 64),
                val_loader=loader(TensorDataset(x[3200:], y[3200:]), 200, shuffle=False),
                loss_fn=loss, max_steps=200, clip_grad_norm=1.0)
