"""Family ``targets``: what the student or the incremental head is asked to predict."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_be.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    loader,
    mean_over,
    plain_acc,
    rmse_of,
    seed,
)
from benchmarks.blind_preflight_be.synth import blobs, mlp, split, teacher


# --- 1. teacher trained with another class order than the student's dataset -------------------------------------------
def kd_teacher_class_order(fixed: bool = False):
    seed(0)
    x, y = blobs(3000, 16, 5, 5)
    t = teacher(3000, 16, 5, 5)
    # the teacher checkpoint came from a pipeline that sorted class names; ours keeps the csv order
    teacher_to_ours = torch.arange(5) if fixed else torch.tensor([2, 0, 4, 1, 3])
    (xt, yt), (xv, yv) = split(x, y, 2400)
    student = mlp(16, 32, 5)
    T = 3.0

    def kd_loss(model, batch):
        xb, yb = batch
        s = model(xb)
        with torch.no_grad():
            tl = t(xb)[:, teacher_to_ours]
        soft = F.kl_div(F.log_softmax(s / T, -1), F.softmax(tl / T, -1), reduction="batchmean") * T * T
        return 0.8 * soft + 0.2 * F.cross_entropy(s, yb)
    return dict(model=student, optimizer=torch.optim.Adam(student.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 256, False),
                loss_fn=kd_loss, max_steps=300)


case("kd_teacher_class_order", "targets",
     "The teacher's logit columns are in a different class order than the student's labels (a permutation of the 5 "
     "classes), so the soft targets put the teacher's confidence on the wrong classes and the KL term fights the hard "
     "cross-entropy; map the teacher's classes to the dataset's order before the softmax.",
     r"class order|order of (the )?classes|permut\w*|wrong class(es)?|label (order|mapping)|column order|te"
     r"acher.{0,60}(order|mapping)",
     )(kd_teacher_class_order)
fix("kd_teacher_class_order", fixed_of(kd_teacher_class_order), plain_acc, "val acc")


# --- 2. class-incremental: new task's labels not offset in the expanded head -----------------------------------------
def class_incremental_no_offset(fixed: bool = False):
    seed(0)
    x, y = blobs(3600, 16, 8, 6)
    (xt, yt), (xv, yv) = split(x, y, 2800)
    old = yt < 4
    # task 2: a replay buffer of 400 old samples plus the new classes 4..7, stored with task-local labels 0..3
    replay_x, replay_y = xt[old][:400], yt[old][:400]
    new_x, new_local = xt[~old], yt[~old] - 4
    new_y = new_local + 4 if fixed else new_local
    model = mlp(16, 64, 8)                    # head expanded to 4 old + 4 new classes
    ds = TensorDataset(torch.cat([replay_x, new_x]), torch.cat([replay_y, new_y]))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(ds, 64), val_loader=loader(TensorDataset(xv, yv), 256, False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("class_incremental_no_offset", "targets",
     "In the class-incremental step the new task's classes keep their task-local labels 0..3 instead of being offset "
     "by the 4 old classes to 4..7, so they are trained onto the old classes' outputs of the expanded head and the "
     "new head units never get a positive target; add the number of old classes to the new labels.",
     r"offset|task[- ]local|local labels?|labels? (collide|overlap|clash)|number of (old|previous|seen) classes|"
     r"(new|old) classes?.{0,80}(same|old|overlap)|never.{0,40}positive|label (shift|remap)",
     )(class_incremental_no_offset)
fix("class_incremental_no_offset", fixed_of(class_incremental_no_offset), plain_acc, "val acc (all 8 classes)")


# --- 3. multi-label distillation with softmax soft targets -------------------------------------------------------------
def _multilabel(s):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(3000, 16, generator=g)
    w = torch.randn(16, 6, generator=g)
    return x, (x @ w > 0).float()


def _ml_teacher(x, y):
    torch.manual_seed(7)
    t = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 6))
    opt = torch.optim.Adam(t.parameters(), lr=3e-3)
    for _ in range(300):
        loss = F.binary_cross_entropy_with_logits(t(x), y)
        opt.zero_grad(), loss.backward(), opt.step()
    return t.eval().requires_grad_(False)


def multilabel_teacher_softmax(fixed: bool = False):
    seed(0)
    x, y = _multilabel(8)
    (xt, yt), (xv, yv) = split(x, y, 2400)
    t = _ml_teacher(xt, yt)
    student = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 6))

    def kd_loss(model, batch):
        xb, _ = batch
        with torch.no_grad():
            logits = t(xb)
            soft = torch.sigmoid(logits) if fixed else F.softmax(logits, dim=-1)
        return F.binary_cross_entropy_with_logits(model(xb), soft)
    return dict(model=student, optimizer=torch.optim.Adam(student.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(xt, yt), 64), val_loader=loader(TensorDataset(xv, yv), 200, False),
                loss_fn=kd_loss, max_steps=300)


case("multilabel_teacher_softmax", "targets",
     "The tags are multi-label (independent sigmoids) but the teacher's soft targets are made with softmax over the 6 "
     "tags, which forces them to sum to 1 so no tag gets a target above about 0.5 and the student learns to predict "
     "every tag off; use torch.sigmoid on the teacher logits for multi-label soft targets.",
     r"softmax|sum to (1|one)|multi-?label|sigmoid|mutually exclusive|independent",
     )(multilabel_teacher_softmax)
fix("multilabel_teacher_softmax", fixed_of(multilabel_teacher_softmax),
    lambda m, kw: mean_over(
        m, kw["val_loader"], lambda mm, b: (((mm(b[0]) > 0).float() == b[1]).all(1).float().sum().item(), len(b[1]))),
    "val exact-match")


# --- 4. regression distillation from a teacher that predicts z-scored targets -----------------------------------------
def kd_regression_teacher_zscored(fixed: bool = False):
    seed(0)
    g = torch.Generator().manual_seed(25)
    x = torch.randn(3000, 12, generator=g)
    y = 40 + 12 * torch.tanh(x @ torch.randn(12, generator=g) / 3) + 3 * torch.sin(x[:, 0]) + torch.randn(3000, generator=g)
    mu, sd = y[:2400].mean(), y[:2400].std()
    torch.manual_seed(3)
    t = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 1))     # the teacher was fit on (y - mu) / sd
    opt = torch.optim.Adam(t.parameters(), lr=3e-3)
    for _ in range(400):
        loss = F.mse_loss(t(x[:2400]).squeeze(1), (y[:2400] - mu) / sd)
        opt.zero_grad(), loss.backward(), opt.step()
    t.eval().requires_grad_(False)
    student = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
    with torch.no_grad():
        student[2].bias.fill_(float(mu))

    def kd_loss(m, batch):
        xb, yb = batch
        pred = m(xb).squeeze(1)
        with torch.no_grad():
            tp = t(xb).squeeze(1)
            if fixed:
                tp = tp * sd + mu
        return 0.5 * F.mse_loss(pred, yb) + 0.5 * F.mse_loss(pred, tp)
    return dict(model=student, optimizer=torch.optim.Adam(student.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(x[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 200, False), loss_fn=kd_loss, max_steps=300)


case("kd_regression_teacher_zscored", "targets",
     "The regression teacher was trained on z-scored targets, so its predictions are in standard-deviation units "
     "around 0 while the hard targets are raw values around 40; the distillation MSE pulls the student halfway "
     "between the two scales. Un-standardise the teacher output (t * std + mean) before the MSE.",
     r"z-?scor\w*|teacher.{0,80}(standardi|normali|units)|(different|wrong) (units|scales?)|std(dev)? units"
     r"|raw (units|values)|\* ?std|un-?(standardi|normali|scal)\w*|invert\w* the teacher|inverse transform|"
     r"multiply by (the )?std",
     )(kd_regression_teacher_zscored)
fix("kd_regression_teacher_zscored", fixed_of(kd_regression_teacher_zscored),
    rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False)


# --- 5. binary distillation: softmax over the teacher's single logit ---------------------------------------------------
def kd_binary_softmax_single_logit(fixed: bool = False):
    seed(0)
    g = torch.Generator().manual_seed(32)
    x = torch.randn(3000, 16, generator=g)
    y = (torch.tanh(x @ torch.randn(16, 8, generator=g) / 2).sum(1) > 0.8).float()      # ~35% positives
    torch.manual_seed(5)
    t = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(t.parameters(), lr=3e-3)
    for _ in range(400):
        loss = F.binary_cross_entropy_with_logits(t(x[:2400]).squeeze(1), y[:2400])
        opt.zero_grad(), loss.backward(), opt.step()
    t.eval().requires_grad_(False)
    student = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    T = 2.0

    def kd_loss(m, batch):
        xb, _ = batch
        with torch.no_grad():
            tl = t(xb) / T                                                # (B, 1)
            soft = torch.sigmoid(tl) if fixed else F.softmax(tl, dim=-1)   # same line as the multi-class KD
        return F.binary_cross_entropy_with_logits(m(xb) / T, soft)
    return dict(model=student, optimizer=torch.optim.Adam(student.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 200, False), loss_fn=kd_loss, max_steps=300)


case("kd_binary_softmax_single_logit", "targets",
     "The binary teacher has a single output logit and its soft target is F.softmax over that size-1 axis, which is "
     "1.0 for every sample, so the student is distilled to call everything positive; use torch.sigmoid for a "
     "single-logit teacher (or give both a 2-class head).",
     r"softmax|single (logit|output)|size[- ]1|all (ones|1(\.0)?)|always (1|one|positive)|sigmoid|constant target",
     )(kd_binary_softmax_single_logit)
fix("kd_binary_softmax_single_logit", fixed_of(kd_binary_softmax_single_logit),
    acc_of(lambda m, b: ((m(b[0]).squeeze(1) > 0).float(), b[1])), "val acc")
