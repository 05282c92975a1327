"""Set al, family mechanics: the optimizer, schedule, precision or loss weighting make the updates useless."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_al.registry import (
    acc_of,
    adam,
    case,
    ds,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    seed,
    teacher_classes,
)


def _argmax_fwd(m, b):
    return m(b[0]).argmax(-1), b[-1]


def mlp(d, c, h=64):
    return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, c))


# 16 ----------------------------------------------------------------- HF linear schedule sized in epochs
@case("al_hf_schedule_total_in_epochs", "mechanics",
      "get_linear_schedule_with_warmup is given num_training_steps=EPOCHS (3) while scheduler.step() runs every "
      "batch, so the learning rate decays linearly to 0 after 3 optimizer steps and stays 0 for the rest of the run.",
      r"num_training_steps|get_linear_schedule|(learning rate|LR|lr).{0,80}(reaches|drops to|decays to|hits|becomes|is) "
      r"(0|zero)|(epochs?).{0,80}(instead of|rather than|not).{0,30}(steps|batches|len\(.{0,20}loader)|schedule.{0,60}"
      r"(too short|ends|finished|length)")
def al_hf_schedule_total_in_epochs(fixed=False):
    from transformers import get_linear_schedule_with_warmup
    seed(0)
    x, y = teacher_classes(1500, 16, 4, 33)
    model = mlp(16, 4)
    opt = torch.optim.AdamW(model.parameters(), 3e-3)
    epochs = 3
    train = loader(ds(x[:1200], y[:1200]))
    total = epochs * len(train) if fixed else epochs
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=0, num_training_steps=total)
    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=train, max_steps=epochs * len(train),
                val_loader=loader(ds(x[1200:], y[1200:]), 100, shuffle=False), loss_fn=nn.CrossEntropyLoss())


# 17 ----------------------------------------------------------------- LambdaLR lambda returns the LR, not a factor
@case("al_lambdalr_returns_lr", "mechanics",
      "The LambdaLR warm-up lambda returns the learning rate itself (1e-3 * min(1, step / 100)) instead of a "
      "multiplicative factor, and LambdaLR multiplies it by the optimizer's lr=1e-3, so the run trains at about 1e-6.",
      r"LambdaLR|lr_lambda|multiplicative factor|(factor|multiplier).{0,60}(not|instead of|rather than).{0,30}"
      r"(learning rate|LR|lr)|(learning rate|LR|lr).{0,40}(multiplied|squared|twice|1e-6|1e-06|tiny)")
def al_lambdalr_returns_lr(fixed=False):
    seed(0)
    x, y = teacher_classes(1500, 16, 4, 35)
    model = mlp(16, 4)
    base = 1e-3
    opt = torch.optim.Adam(model.parameters(), lr=base)
    if fixed:
        lam = lambda step: min(1.0, (step + 1) / 100)                      # noqa: E731
    else:
        lam = lambda step: base * min(1.0, (step + 1) / 100)               # noqa: E731
    return dict(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lam),
                train_loader=loader(ds(x[:1200], y[:1200])), val_loader=loader(ds(x[1200:], y[1200:]), 100,
                                                                                  shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=400)


# 18 ----------------------------------------------------------------- weights cast to bf16 (no fp32 master copy)
class Bf16Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x):
        return self.net(x.to(self.net[0].weight.dtype))


def bf16_ce(model, batch):
    return nn.functional.cross_entropy(model(batch[0]).float(), batch[1])


@case("al_pure_bf16_weights", "mechanics",
      "The model itself is cast with model.to(torch.bfloat16) and trained with Adam at lr=5e-4: each update is smaller "
      "than half a bf16 ulp of most weights (about 8 significant bits), so it rounds away and the weights hardly move; "
      "keep fp32 weights and use autocast.",
      r"bfloat16|bf16.{0,80}(weights?|parameters?|master|round|ulp)|(round|rounded|rounding).{0,60}"
      r"(update|weights?)|master (weights?|copy)|(weights?|parameters?) (are|stored|kept) in (bf16|half|bfloat16)"
      r"|fp32 (weights|copy|master)")
def al_pure_bf16_weights(fixed=False):
    seed(0)
    x, y = teacher_classes(1500, 8, 3, 37)
    model = Bf16Net()
    with torch.no_grad():
        for m in model.net:
            if isinstance(m, nn.Linear):
                m.weight.mul_(2.0)
    if not fixed:
        model = model.to(torch.bfloat16)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 5e-4), precision="bf16",
                train_loader=loader(ds(x[:1200], y[:1200])), val_loader=loader(ds(x[1200:], y[1200:]), 100,
                                                                                  shuffle=False), loss_fn=bf16_ce)


# 19 ----------------------------------------------------------------- class weights = frequencies, not inverse
def imbalanced(n, s):
    g = gen(s)
    y = torch.multinomial(torch.tensor([0.82, 0.13, 0.05]), n, replacement=True, generator=g)
    centers = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.2, 0.6, 0.0, 0.0], [0.0, 1.2, 0.6, 0.0]])
    x = centers[y] + torch.randn(n, 4, generator=g)
    return torch.cat([x, torch.randn(n, 8, generator=g)], 1), y


def balanced_acc(model, kw):
    preds, ys = [], []
    was = model.training
    model.eval()
    with torch.no_grad():
        for b in kw["val_loader"]:
            preds.append(model(b[0]).argmax(-1).cpu())
            ys.append(b[1].cpu())
    model.train(was)
    p, y = torch.cat(preds), torch.cat(ys)
    return sum(((p == c) & (y == c)).sum().item() / max((y == c).sum().item(), 1) for c in range(3)) / 3


@case("al_class_weight_frequency", "mechanics",
      "CrossEntropyLoss(weight=...) is given each class's frequency (counts / N) instead of its inverse, so the "
      "majority class is weighted up and the rare classes down, and the model almost never predicts the rare ones.",
      r"(class[_ ]?)?weights?.{0,80}(frequenc|counts?|proportion|prior).{0,60}(instead of|not|rather than|inverse|"
      r"invert|reciprocal)|(inverse|reciprocal) (class )?(frequenc|counts?)|(majority|frequent) class (is )?(up-?weighted|weighted (up|more|higher))")
def al_class_weight_frequency(fixed=False):
    seed(0)
    x, y = imbalanced(3000, 39)
    counts = torch.bincount(y[:2400], minlength=3).float()
    freq = counts / counts.sum()
    weight = (1.0 / freq) / (1.0 / freq).sum() * 3 if fixed else freq * 3
    model = mlp(12, 3)
    return dict(model=model, optimizer=adam(model), train_loader=loader(ds(x[:2400], y[:2400]), 64),
                val_loader=loader(ds(x[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(weight=weight))


# 20 ----------------------------------------------------------------- multi-task loss with a raw-dollar MSE term
def listings(n, s):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    price = 250_000 + 80_000 * (x[:, 0] + 0.5 * x[:, 1]) + 10_000 * torch.randn(n, generator=g)
    kind = ((x[:, 4] + x[:, 5] - x[:, 6]) > 0).long() + ((x[:, 7] - x[:, 8]) > 0.8).long()
    return x, price, kind


class TwoHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 64), nn.ReLU())
        self.price, self.kind = nn.Linear(64, 1), nn.Linear(64, 3)

    def forward(self, x):
        h = self.trunk(x)
        return self.price(h).squeeze(-1), self.kind(h)


def two_task_loss(model, batch):
    x, price, kind = batch
    p, k = model(x)
    return nn.functional.mse_loss(p, price) + nn.functional.cross_entropy(k, kind)


def kind_acc(model, kw):
    def fn(m, b):
        return (m(b[0])[1].argmax(-1) == b[2]).sum().item(), len(b[2])
    return mean_over(model, kw["val_loader"], fn)


@case("al_multitask_unscaled_loss", "mechanics",
      "The multi-task loss adds an MSE on raw prices (in dollars, ~1e10 per sample) to the property-type "
      "cross-entropy (~1): with clip_grad_norm=1.0 the global norm is all price gradient, so the classification head's "
      "gradients are scaled by ~1e-5 and it never learns; standardize the price or weight the terms.",
      r"(MSE|regression|price) (loss|term).{0,80}(dominat|swamp|drown|overwhelm|much larger|orders? of magnitude)"
      r"|(loss|gradient)s? .{0,40}(dominat|swamp|drown|overwhelm)|(classification|cross-?entropy|CE) (head|term|loss|"
      r"gradients?).{0,80}(scaled|tiny|starv|never learns|clipp)|clip_grad_norm.{0,100}(price|MSE|regression|dominat)"
      r"|(weight|balanc)\w* (the )?(two |task )?(loss(es)?|terms|tasks)|raw (prices|dollars)")
def al_multitask_unscaled_loss(fixed=False):
    seed(0)
    x, price, kind = listings(1500, 41)
    if fixed:
        price = (price - 250_000) / 80_000
    model = TwoHead()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), 0.05, momentum=0.9), clip_grad_norm=1.0,
                train_loader=loader(ds(x[:1200], price[:1200], kind[:1200])),
                val_loader=loader(ds(x[1200:], price[1200:], kind[1200:]), 100, shuffle=False), loss_fn=two_task_loss)


fix("al_hf_schedule_total_in_epochs", fixed_of(al_hf_schedule_total_in_epochs), acc_of(_argmax_fwd), "val accuracy",
    steps=150)
fix("al_lambdalr_returns_lr", fixed_of(al_lambdalr_returns_lr), acc_of(_argmax_fwd), "val accuracy", steps=300)
fix("al_pure_bf16_weights", fixed_of(al_pure_bf16_weights), acc_of(_argmax_fwd), "val accuracy", steps=300)
fix("al_class_weight_frequency", fixed_of(al_class_weight_frequency), balanced_acc, "val balanced accuracy", steps=300)
fix("al_multitask_unscaled_loss", fixed_of(al_multitask_unscaled_loss), kind_acc, "val type accuracy", steps=300)
