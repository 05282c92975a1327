"""What is trained: teachers in the optimizer, heads outside it, frozen students, plain-tensor cut-points."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight.fixes import val_acc
from benchmarks.blind_preflight_au.registry import FIX_TABLE, case, fixed_of, gen, loader, mlp, oracle_teacher, seed


class Distiller(nn.Module):
    def __init__(self, student, teacher):
        super().__init__()
        self.student, self.teacher = student, teacher

    def forward(self, x):
        return self.student(x)


def transfer_set(n, d, teacher, s):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    with torch.no_grad():
        y = teacher(x).argmax(1)
    return x, y


# 1. teacher's parameters in the optimizer and in the graph
@case("kd_teacher_in_optimizer", "what_is_trained",
      "The distillation wrapper's optimizer is built from model.parameters(), which includes the teacher, and the "
      "teacher runs with gradients, so the KL loss also moves the teacher toward the untrained student.",
      r"teacher.*(optimi[sz]er|requires_grad|trainable|gradient|updated|frozen|freeze|no_grad|detach)|"
      r"(freeze|frozen|detach|no_grad).*teacher")
def kd_teacher_in_optimizer(fixed=False):
    seed(30)
    teacher = oracle_teacher(12, 8, s=31, scale=1.0)
    student = mlp(12, 8, hidden=64)
    model = Distiller(student, teacher)
    if fixed:
        teacher.requires_grad_(False)
    x, y = transfer_set(2400, 12, teacher, 32)
    temp = 2.0

    def kd(model, batch):
        xb, _ = batch
        t = model.teacher(xb)
        s = model.student(xb)
        return F.kl_div(F.log_softmax(s / temp, 1), F.softmax(t / temp, 1), reduction="batchmean") * temp ** 2

    params = model.student.parameters() if fixed else model.parameters()
    return dict(model=model, optimizer=torch.optim.Adam(params, 1e-2),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=kd, max_steps=300)


FIX_TABLE.fix("kd_teacher_in_optimizer", fixed_of(kd_teacher_in_optimizer), val_acc, "val acc vs teacher")


# 2. optimizer built before the classification head is replaced
class Backbone(nn.Module):
    def __init__(self, d, h, s):
        super().__init__()
        g = gen(s)
        self.proj = nn.Linear(d, h)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(h, d, generator=g) / d ** 0.5)
            self.proj.bias.zero_()
        self.head = nn.Linear(h, 10)

    def forward(self, x):
        return self.head(torch.relu(self.proj(x)))


@case("head_replaced_after_optimizer", "what_is_trained",
      "The optimizer is created from the pretrained model's trainable parameters before model.head is replaced by "
      "a new nn.Linear, so the new head's parameters are not in the optimizer and, with the backbone frozen, "
      "nothing in the model is updated.",
      r"(new|replaced?) head.*(not|missing).*optimi[sz]er|head.*(not in|missing from) (the )?optimi[sz]er|"
      r"optimi[sz]er.*(created|built).*before.*(head|replac)|(replac\w*|new) head.*after.*optimi[sz]er|"
      r"stale optimi[sz]er|old head")
def head_replaced_after_optimizer(fixed=False):
    seed(33)
    model = Backbone(10, 128, s=34)
    for p in model.proj.parameters():
        p.requires_grad_(False)
    g = gen(35)
    x = torch.randn(2400, 10, generator=g)
    with torch.no_grad():
        w = torch.randn(128, 3, generator=g)
        y = (torch.relu(model.proj(x)) @ w).argmax(1)
    if not fixed:
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 3e-3)
        model.head = nn.Linear(128, 3)
    else:
        model.head = nn.Linear(128, 3)
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 3e-3)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


FIX_TABLE.fix("head_replaced_after_optimizer", fixed_of(head_replaced_after_optimizer), val_acc, "val acc")


# 3. freezing "the teacher's encoder" by substring also freezes the student's encoder
class Net(nn.Module):
    def __init__(self, d, h, c):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU())
        self.classifier = nn.Linear(h, c)

    def forward(self, x):
        return self.classifier(self.encoder(x))


class TeacherStudent(nn.Module):
    def __init__(self, teacher, student):
        super().__init__()
        self.teacher, self.student = teacher, student

    def forward(self, x):
        return self.student(x)


@case("freeze_by_substring_hits_student", "what_is_trained",
      "Parameters are frozen with `if 'encoder' in name: p.requires_grad = False`, meant for teacher.encoder, but "
      "the student's own encoder also matches, so only the student's last linear layer trains on top of random "
      "features.",
      r"'encoder' in|substring|name (match|filter|pattern)|student.*(frozen|requires_grad|not (train|updat))|"
      r"(frozen|requires_grad=False).*student|student\.encoder|startswith")
def freeze_by_substring_hits_student(fixed=False):
    seed(36)
    g = gen(37)
    x = torch.randn(2400, 6, generator=g)
    y = ((torch.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2] + torch.cos(x[:, 3] * x[:, 4])) * 2).round().clamp(-3, 3) + 3
    y = y.long()
    teacher = Net(6, 128, 7)
    student = Net(6, 32, 7)
    model = TeacherStudent(teacher, student)
    for name, p in model.named_parameters():
        if (name.startswith("teacher.") if fixed else "encoder" in name):
            p.requires_grad = False
    for p in model.teacher.parameters():
        p.requires_grad = False

    def loss(model, batch):
        xb, yb = batch
        return F.cross_entropy(model.student(xb), yb)

    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.student.parameters()], 3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=loss, max_steps=300)


FIX_TABLE.fix("freeze_by_substring_hits_student", fixed_of(freeze_by_substring_hits_student), val_acc, "val acc")


# 4. ordinal cut-points as a plain tensor attribute
class CumulativeLink(nn.Module):
    def __init__(self, d, k, fixed):
        super().__init__()
        self.score = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 1))
        if fixed:
            self.cutpoints = nn.Parameter(torch.zeros(k - 1))
        else:
            self.cutpoints = torch.zeros(k - 1, requires_grad=True)

    def forward(self, x):                       # logits of P(y > k), k = 0..K-2
        return self.score(x) - self.cutpoints.to(x.device)


@case("ordinal_cutpoints_plain_tensor", "what_is_trained",
      "The cumulative-link head stores its cut-points as torch.zeros(K-1, requires_grad=True), a plain tensor "
      "attribute rather than an nn.Parameter, so they are not in model.parameters(), never reach the optimizer and "
      "stay equal, and only the two extreme grades can be predicted.",
      r"nn\.Parameter|not (a |an )?(registered )?param|plain tensor|register_(parameter|buffer)|"
      r"not in model\.parameters|cut-?points?|thresholds? (never|not) (learn|updat|train)")
def ordinal_cutpoints_plain_tensor(fixed=False):
    seed(38)
    g = gen(39)
    x = torch.randn(2400, 10, generator=g)
    w = torch.randn(10, generator=g)
    y = torch.bucketize(x @ w / 10 ** 0.5, torch.tensor([-1.0, -0.3, 0.3, 1.0]))
    model = CumulativeLink(10, 5, fixed)

    def loss(model, batch):
        xb, yb = batch
        levels = (yb.unsqueeze(1) > torch.arange(4, device=yb.device)).float()
        return F.binary_cross_entropy_with_logits(model(xb), levels)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=loss, max_steps=300)


@torch.no_grad()
def rank_acc(model, kw):
    model.eval()
    r = n = 0
    for xb, yb in kw["val_loader"]:
        r += ((model(xb) > 0).sum(1) == yb).sum().item()
        n += yb.numel()
    model.train()
    return r / n


FIX_TABLE.fix("ordinal_cutpoints_plain_tensor", fixed_of(ordinal_cutpoints_plain_tensor), rank_acc, "val grade acc")


# 5. student forward on the unlabelled batch inside the teacher's no_grad block
@case("ssl_student_forward_in_no_grad", "what_is_trained",
      "In the teacher-student semi-supervised loss the student's forward on the unlabelled batch sits inside the "
      "same torch.no_grad() block as the teacher's, so the distillation term has no gradient and only the 40 "
      "labelled examples train the student.",
      r"no_grad|inference_mode|(distillation|unlabel\w*|kd|consistency) (term|loss).*(no|zero) grad|"
      r"(no|zero) grad.*(distillation|unlabel|kd|consistency)|student.*(detach|without grad)")
def ssl_student_forward_in_no_grad(fixed=False):
    seed(40)
    teacher = oracle_teacher(16, 5, s=41)
    x, y = transfer_set(3400, 16, teacher, 42)
    xl, yl = x[:40], y[:40]
    xu = x[40:2840]
    model = Distiller(mlp(16, 5), teacher)
    model.teacher.requires_grad_(False)
    idx_l = torch.arange(2800) % 40

    def loss(model, batch):
        xb_l, yb_l, xb_u = batch
        sup = F.cross_entropy(model.student(xb_l), yb_l)
        with torch.no_grad():
            t = model.teacher(xb_u)
            if not fixed:
                s = model.student(xb_u)
        if fixed:
            s = model.student(xb_u)
        unsup = F.kl_div(F.log_softmax(s, 1), F.softmax(t, 1), reduction="batchmean")
        return sup + unsup

    return dict(model=model, optimizer=torch.optim.Adam(model.student.parameters(), 3e-3),
                train_loader=loader(TensorDataset(xl[idx_l], yl[idx_l], xu), 64),
                val_loader=loader(TensorDataset(x[2840:], y[2840:]), 280, shuffle=False),
                loss_fn=loss, max_steps=300)


FIX_TABLE.fix("ssl_student_forward_in_no_grad", fixed_of(ssl_student_forward_in_no_grad), val_acc, "val acc")
