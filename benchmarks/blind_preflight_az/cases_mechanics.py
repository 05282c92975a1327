"""Mechanics: schedulers counted in epochs, class weights, truncated recurrences, loss formulas, output ranges."""

from __future__ import annotations

import math

import torch
from torch import nn

from benchmarks.blind_preflight_az.registry import (
    acc_of,
    accel_stream,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seasonal_panel,
    seed,
    tds,
    windows,
)


def _panel_xy(panel, w, h):
    xs, ys = zip(*(windows(p, w, h) for p in panel))
    return torch.cat(xs), torch.cat(ys)


@case("mechanics_steplr_epochs_stepped_per_batch", "mechanics",
      bug="StepLR(step_size=10, gamma=0.5) was sized in epochs but scheduler.step() runs every batch: the learning "
          "rate halves every 10 optimizer steps and is ~1e-12 of its start after 300 steps.",
      cause_pattern=r"(scheduler|step_?lr|lr).{0,80}(per|every|each) (batch|step|iteration)|(epoch|batch).{0,60}"
                    r"(instead of|rather than|not).{0,30}(epoch|batch)|step_size.{0,80}(epoch|steps|batch)|"
                    r"(learning rate|lr).{0,60}(decay|collaps|shrink|vanish|near zero|too (fast|early|quick)|tiny)")
def mechanics_steplr_epochs_stepped_per_batch(fixed: bool = False):
    seed(0)
    x, y = _panel_xy(seasonal_panel(10, 300, 111), 48, 6)
    xv, yv = _panel_xy(seasonal_panel(4, 300, 112), 48, 6)
    model = nn.Sequential(nn.Linear(48, 128), nn.ReLU(), nn.Linear(128, 6))
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    train = loader(tds(x, y), 32)
    step_size = 10 * len(train) if fixed else 10              # the bug: 10 "epochs" counted in batches
    return dict(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.StepLR(opt, step_size, 0.5),
                train_loader=train, val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("mechanics_steplr_epochs_stepped_per_batch", fixed_of(mechanics_steplr_epochs_stepped_per_batch),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


def _imbalanced_har(s, length, w=48, stride=12):
    x, lab = accel_stream(length, 4, s, seg=(60, 140))
    starts = torch.arange(0, length - w, stride)
    idx = starts[:, None] + torch.arange(w)
    xw, yw = x[idx], lab[idx].mode(dim=1).values
    g = gen(s + 1)
    keep = torch.rand(len(yw), generator=g) < torch.tensor([1.0, 0.25, 0.08, 0.08])[yw]   # rare activities
    xw = xw[keep] + 1.2 * torch.randn(int(keep.sum()), w, 3, generator=g)               # noisy wrist sensor
    return xw.transpose(1, 2).contiguous(), yw[keep]


def _balanced_acc(model, kw):
    preds, ys = [], []

    def fn(m, b):
        preds.append(m(b[0]).argmax(-1))
        ys.append(b[1])
        return 0.0, 1.0
    mean_over(model, kw["val_loader"], fn)
    p, y = torch.cat(preds), torch.cat(ys)
    return sum(float((p[y == c] == c).float().mean()) for c in y.unique()) / len(y.unique())


@case("mechanics_class_weights_counts", "mechanics",
      bug="CrossEntropyLoss(weight=...) is given the class frequencies (counts / total) instead of their inverse, "
          "so the rare activities are down-weighted further and never predicted.",
      cause_pattern=r"inverse|1 ?/ ?(count|freq)|(weight|weights).{0,80}(frequenc|count|proportional|invert|backwards|"
                    r"revers)|(rare|minority).{0,60}(down.?weight|ignored|never predicted|less weight)")
def mechanics_class_weights_counts(fixed: bool = False):
    seed(0)
    x, y = _imbalanced_har(121, 80000)
    xv, yv = _imbalanced_har(122, 30000)
    counts = torch.bincount(y, minlength=4).float()
    freq = counts / counts.sum()
    weight = (1 / freq) / (1 / freq).sum() * 4 if fixed else freq * 4   # the bug: frequencies, not inverse
    model = nn.Sequential(nn.Conv1d(3, 32, 7, padding=3), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                          nn.Linear(32, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(tds(x, y), 64), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(weight=weight), max_steps=300)


fix("mechanics_class_weights_counts", fixed_of(mechanics_class_weights_counts), _balanced_acc,
    "val balanced accuracy")


class CellForecaster(nn.Module):
    """A GRUCell unrolled by hand over the window (the user adds per-step covariates later)."""

    def __init__(self, detach_each_step):
        super().__init__()
        self.detach = detach_each_step
        self.cell = nn.GRUCell(1, 32)
        self.head = nn.Linear(32, 1)

    def forward(self, x):                                     # x: (B, T, 1)
        h = x.new_zeros(x.size(0), 32)
        for t in range(x.size(1)):
            h = self.cell(x[:, t], h)
            if self.detach:
                h = h.detach()                                # the bug: "truncated BPTT" inside the time loop
        return self.head(h)


def _lag_task(n, s, w=16):
    """The target is the value 12 steps back (a weekly-style seasonal lag) plus noise; the recent values are noise."""
    g = gen(s)
    x = torch.randn(n, w, 1, generator=g)
    y = x[:, w - 12] * 1.0 + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


@case("mechanics_detach_inside_time_loop", "mechanics",
      bug="The hand-unrolled GRUCell detaches the hidden state at every time step (h = h.detach() inside the loop), "
          "so no gradient flows back through time and the 12-step lag the target depends on cannot be learned.",
      cause_pattern=r"detach|truncat.{0,40}(bptt|backprop)|(gradient|backprop)s?.{0,60}(through time|across "
                    r"(time )?steps|one step|cut|blocked|stopp)|bptt|(hidden|state).{0,60}(cut|severed|graph)")
def mechanics_detach_inside_time_loop(fixed: bool = False):
    seed(0)
    x, y = _lag_task(4000, 131)
    xv, yv = _lag_task(800, 132)
    model = CellForecaster(detach_each_step=not fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 1e-2),
                train_loader=loader(tds(x, y), 64), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("mechanics_detach_inside_time_loop", fixed_of(mechanics_detach_inside_time_loop),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


@case("mechanics_loss_square_of_mean", "mechanics",
      bug="The hand-written MSE is ((pred - y).mean()) ** 2, the square of the mean error, not "
          "((pred - y) ** 2).mean(): errors of opposite sign cancel and only the overall bias is fitted.",
      cause_pattern=r"square of the mean|mean\(\) ?\)? ?\*\* ?2|\.mean\(\)\*\*2|(errors?|residuals?).{0,60}"
                    r"(cancel|opposite sign)|mean of (the )?squared|(\(pred - y\)|residual) ?\*\* ?2\)?\.mean|"
                    r"only (the )?(overall |mean )?(bias|offset)")
def mechanics_loss_square_of_mean(fixed: bool = False):
    seed(0)
    x, y = _panel_xy(seasonal_panel(10, 260, 141), 24, 1)
    xv, yv = _panel_xy(seasonal_panel(4, 260, 142), 24, 1)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1))

    def loss_fn(m, batch):
        xb, yb = batch
        err = m(xb) - yb
        return (err ** 2).mean() if fixed else err.mean() ** 2    # the bug
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(tds(x, y), 32), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=loss_fn, max_steps=300)


fix("mechanics_loss_square_of_mean", fixed_of(mechanics_loss_square_of_mean),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", higher=False)


@case("mechanics_relu_output_zscored_target", "mechanics",
      bug="The forecaster ends in nn.ReLU() (demand is non-negative) but the targets were z-scored, so every "
          "below-average value is unreachable and the negative half of the residuals gets no gradient.",
      cause_pattern=r"relu.{0,80}(output|final|last|head|negative)|(output|final|last) (layer|activation).{0,60}"
                    r"(relu|non-?negative|clamp)|(z-?scor|standardi[sz]|normali[sz]).{0,80}negative|"
                    r"negative (targets?|values?).{0,60}(unreachable|cannot|can't|never)|dead (relu|output)")
def mechanics_relu_output_zscored_target(fixed: bool = False):
    seed(0)
    g = gen(151)
    t = torch.arange(3000, dtype=torch.float32)
    demand = 50 + 20 * torch.sin(2 * math.pi * t / 24) + 5 * torch.randn(3000, generator=g)
    z = (demand - demand[:2000].mean()) / demand[:2000].std()
    x, y = windows(z[:2000], 24, 1)
    xv, yv = windows(z[2000:], 24, 1)
    layers = [nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1)]
    model = nn.Sequential(*layers) if fixed else nn.Sequential(*layers, nn.ReLU())   # the bug
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(tds(x, y), 32), val_loader=loader(tds(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


fix("mechanics_relu_output_zscored_target", fixed_of(mechanics_relu_output_zscored_target),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE (z units)", higher=False)

_ = acc_of
