"""Shapes: broadcasting and axis slips in distillation, multi-label, ordinal and weighted losses."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_au.registry import (
    FIX_TABLE,
    balanced_acc,
    binary_balanced_acc,
    blobs,
    case,
    fixed_of,
    gen,
    loader,
    mlp,
    seed,
)


# 1. hand-written binary focal loss, logits (N, 1) against targets (N,) -> (N, N)
@case("focal_binary_n1_vs_n", "shapes",
      "A hand-written binary focal loss gets logits of shape (N, 1) and float targets of shape (N,), so the "
      "elementwise terms broadcast to (N, N) and every prediction is pushed toward the batch's positive rate.",
      r"focal.*(broadcast|\(N,\s*1\)|shape|squeeze|\(N,\s*N\))|(broadcast|squeeze|shape).*focal")
def focal_binary_n1_vs_n(fixed=False):
    seed(0)
    x, y = blobs(3000, 12, [0.88, 0.12], sep=0.7, s=1)
    y = y.float()
    model = mlp(12, 1)

    def focal(model, batch, gamma=2.0, alpha=0.85):
        xb, yb = batch
        logits = model(xb)
        if fixed:
            logits = logits.squeeze(1)
        p = torch.sigmoid(logits).clamp(1e-6, 1 - 1e-6)
        pos = -alpha * yb * (1 - p) ** gamma * torch.log(p)
        neg = -(1 - alpha) * (1 - yb) * p ** gamma * torch.log(1 - p)
        return (pos + neg).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TensorDataset(x[:2400], y[:2400]), 64),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 256, shuffle=False),
                loss_fn=focal, max_steps=300)


FIX_TABLE.fix("focal_binary_n1_vs_n", fixed_of(focal_binary_n1_vs_n), binary_balanced_acc, "val balanced acc")


# 2. distillation of a sequence tagger with the teacher softmax over time instead of classes
class Tagger(nn.Module):
    def __init__(self, d, c):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 64), nn.Tanh(), nn.Linear(64, c))

    def forward(self, x):          # (B, T, d) -> (B, T, C)
        return self.net(x)


@case("kd_softmax_time_dim", "shapes",
      "The distillation target is F.softmax(teacher_logits / T, dim=1) on (batch, time, classes) logits, a "
      "distribution over time steps rather than over classes, while the student's log_softmax is over the last dim.",
      r"softmax.*dim\s*=\s*1|dim\s*=\s*1.*softmax|wrong (dim|axis)|dim\s*=\s*-1|over (the )?time|"
      r"(time|sequence) (axis|dim)|normali[sz]ed over|not over (the )?classes|class (axis|dim)")
def kd_softmax_time_dim(fixed=False):
    seed(1)
    g = gen(2)
    d, c, t = 10, 6, 12
    x = torch.randn(1200, t, d, generator=g)
    w = torch.randn(d, c, generator=g) * 1.5
    bias = torch.linspace(-2, 2, c)
    teacher_logits = x @ w + bias
    labels = teacher_logits.argmax(-1)
    model = Tagger(d, c)
    temp = 2.0

    def kd(model, batch):
        xb, tb, _ = batch
        s = model(xb)
        soft = F.softmax(tb / temp, dim=-1 if fixed else 1)
        return F.kl_div(F.log_softmax(s / temp, dim=-1), soft, reduction="batchmean") * temp ** 2

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TensorDataset(x[:1000], teacher_logits[:1000], labels[:1000]), 32),
                val_loader=loader(TensorDataset(x[1000:], teacher_logits[1000:], labels[1000:]), 100, shuffle=False),
                loss_fn=kd, max_steps=300)



@torch.no_grad()
def _acc(model, kw):
    model.eval()
    r = n = 0
    for b in kw["val_loader"]:
        p = model(b[0]).argmax(-1)
        r += (p == b[-1]).sum().item()
        n += b[-1].numel()
    model.train()
    return r / n


FIX_TABLE.fix("kd_softmax_time_dim", fixed_of(kd_softmax_time_dim), _acc, "val token acc vs teacher")


# 3. multi-label targets stacked label-major then .view(N, C) instead of .t()
class FindingsDataset(Dataset):
    def __init__(self, x, findings, fixed):
        self.x = x
        cols = torch.stack([findings[name] for name in sorted(findings)])   # (C, N)
        self.y = cols.t().contiguous() if fixed else cols.view(len(x), -1)
        self.y = self.y.float()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _findings(x, s=3):
    g = gen(s)
    w = torch.randn(x.shape[1], 5, generator=g)
    z = x @ w
    return {f"f{k}": (z[:, k] > 0.3).long() for k in range(5)}, (z > 0.3).float()


@case("multilabel_view_not_transpose", "shapes",
      "Multi-label targets are stacked label-major into a (C, N) tensor and reshaped with .view(N, C) instead of "
      "transposed, so each row's labels belong to other samples.",
      r"\.view\(N|view\(N,\s*C\)|transpos|\.t\(\)|permute|label-major|\(C,\s*N\)|scrambl|"
      r"labels? (do not|don't) (match|belong|correspond)|belong to other (samples|rows)")
def multilabel_view_not_transpose(fixed=False):
    seed(3)
    g = gen(4)
    x = torch.randn(2400, 16, generator=g)
    xt, xv = x[:2000], x[2000:]
    ft, _ = _findings(xt)
    _, yv = _findings(xv)
    model = mlp(16, 5)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(FindingsDataset(xt, ft, fixed), 64),
                val_loader=loader(TensorDataset(xv, yv), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


@torch.no_grad()
def multilabel_acc(model, kw):
    model.eval()
    r = n = 0
    for xb, yb in kw["val_loader"]:
        r += ((model(xb) > 0).float() == yb).sum().item()
        n += yb.numel()
    model.train()
    return r / n


FIX_TABLE.fix("multilabel_view_not_transpose", fixed_of(multilabel_view_not_transpose), multilabel_acc,
              "val per-label acc")


# 4. ordinal grade regressed with SmoothL1Loss, output (N, 1) vs target (N,)
@case("ordinal_regression_n1_vs_n", "shapes",
      "The severity grade is regressed with nn.SmoothL1Loss on a (N, 1) output against a (N,) float target, which "
      "broadcasts to (N, N) so the model only learns the mean grade.",
      r"(SmoothL1|ordinal|grade|severity).*(broadcast|\(N,\s*1\)|shape|squeeze)|"
      r"(broadcast|squeeze).*(SmoothL1|grade|ordinal)")
def ordinal_regression_n1_vs_n(fixed=False):
    seed(5)
    g = gen(6)
    x = torch.randn(2400, 10, generator=g)
    w = torch.randn(10, generator=g)
    grade = torch.bucketize(x @ w / 10 ** 0.5, torch.tensor([-1.0, -0.3, 0.3, 1.0])).float()
    if fixed:
        grade = grade.unsqueeze(1)
    model = mlp(10, 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TensorDataset(x[:2000], grade[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], grade[2000:]), 200, shuffle=False),
                loss_fn=nn.SmoothL1Loss(), max_steps=300)


@torch.no_grad()
def grade_mae(model, kw):
    model.eval()
    e = n = 0
    for xb, yb in kw["val_loader"]:
        p = model(xb).reshape(-1).round().clamp(0, 4)
        e += (p - yb.reshape(-1)).abs().sum().item()
        n += yb.numel()
    model.train()
    return e / n


FIX_TABLE.fix("ordinal_regression_n1_vs_n", fixed_of(ordinal_regression_n1_vs_n), grade_mae, "val grade MAE",
              higher=False)


# 5. per-sample class weights collated as (N, 1) times per-sample CE (N,)
class WeightedRows(Dataset):
    def __init__(self, x, y, class_w):
        self.x, self.y, self.w = x, y, class_w[y]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], self.w[i:i + 1]        # weight kept as a 1-element tensor


@case("sample_weight_n1_broadcast", "shapes",
      "Per-sample class weights come out of the DataLoader as (N, 1) and multiply the (N,) per-sample "
      "cross-entropy (reduction='none'), which broadcasts to (N, N) so the weighting averages out and the "
      "rare classes get no extra weight.",
      r"weight\w*.*(broadcast|\(N,\s*1\)|\(N,\s*N\)|squeeze)|(broadcast|\(N,\s*1\)).*weight|"
      r"reduction=.?none.*(shape|weight)")
def sample_weight_n1_broadcast(fixed=False):
    seed(7)
    x, y = blobs(4000, 8, [0.85, 0.1, 0.05], sep=0.6, s=8)
    counts = torch.bincount(y[:3200], minlength=3).float()
    class_w = counts.sum() / (3 * counts)
    model = mlp(8, 3)

    def weighted_ce(model, batch):
        xb, yb, wb = batch
        per = F.cross_entropy(model(xb), yb, reduction="none")
        if fixed:
            wb = wb.squeeze(1)
        return (per * wb).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(WeightedRows(x[:3200], y[:3200], class_w), 64),
                val_loader=loader(TensorDataset(x[3200:], y[3200:]), 200, shuffle=False),
                loss_fn=weighted_ce, max_steps=300)


FIX_TABLE.fix("sample_weight_n1_broadcast", fixed_of(sample_weight_n1_broadcast), balanced_acc, "val balanced acc")
