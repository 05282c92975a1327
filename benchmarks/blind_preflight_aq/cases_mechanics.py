"""Mechanics: optimizer, schedule, clipping and precision settings that stall the run."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aq.registry import (
    BoxNet,
    CtcNet,
    DepthNet,
    KpNet,
    SegNet,
    box_data,
    box_metric,
    case,
    ctc_dataset,
    ctc_metric,
    depth_data,
    fix,
    fixed_of,
    heatmap,
    kp_data,
    kp_metric,
    loader,
    rmse_metric,
    seed,
    seg_data,
    seg_metric,
)


def ctc_loss(m, b):
    return F.ctc_loss(m(b[0]).log_softmax(-1).transpose(0, 1).float(), b[1], b[2], b[3], zero_infinity=True)


@case("ctc_exponential_lr_per_batch", "mechanics",
      bug="ExponentialLR(gamma=0.8) is meant to decay once per epoch but is stepped after every batch, so the "
          "learning rate is below 1e-6 of its start after 60 steps and the acoustic model stops learning.",
      cause_pattern=r"(?i)(exponentiallr|gamma ?= ?0\.8|(per|every|each) (batch|step|iteration).{0,80}"
                    r"(per|every|each|once a) epoch|(per|every|each|once a) epoch.{0,80}(per|every|each) "
                    r"(batch|step|iteration)|learning rate.{0,60}(decay\w*|collaps\w*|vanish\w*) (to|towards) (0|zero))")
def ctc_exponential_lr_per_batch(fixed=False):
    seed(0)
    model = CtcNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    steps_per_epoch = 30
    gamma = 0.8 ** (1 / steps_per_epoch) if fixed else 0.8
    return dict(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma),
                train_loader=loader(ctc_dataset(960, 4), 32), loss_fn=ctc_loss,
                val_loader=loader(ctc_dataset(240, 5), 32, shuffle=False), max_steps=300)


fix("ctc_exponential_lr_per_batch", fixed_of(ctc_exponential_lr_per_batch), ctc_metric(), "val 1-CER")


@case("seg_clip_norm_tiny_sgd", "mechanics",
      bug="clip_grad_norm=1e-3 with plain SGD caps every update at lr * 0.001 in norm, so the segmentation net "
          "barely moves from its initialisation in the whole run.",
      cause_pattern=r"(?i)(clip\w*.{0,60}(1e-3|0\.001|too (small|low|tight)|tiny)|max_norm.{0,40}(1e-3|0\.001|"
                    r"small)|(grad\w*|update)s? (are )?(clipp\w*|capp\w*) (to|at) (a )?(tiny|very small))")
def seg_clip_norm_tiny_sgd(fixed=False):
    seed(0)
    x, m = seg_data(1000, 8)
    vx, vm = seg_data(250, 9)
    model = SegNet()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                clip_grad_norm=1.0 if fixed else 1e-3,
                train_loader=loader(TensorDataset(x, m), 32), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(vx, vm), 64, shuffle=False), max_steps=300)


fix("seg_clip_norm_tiny_sgd", fixed_of(seg_clip_norm_tiny_sgd), seg_metric(), "val pixel acc")


@case("kp_adam_eps_one", "mechanics",
      bug="Adam is built with eps=1.0 (the TensorFlow Inception advice), which swamps sqrt(v) for these small "
          "gradients and turns Adam into SGD with a tiny step, so the heatmap head hardly trains.",
      cause_pattern=r"(?i)(eps(ilon)? ?(=|of|is) ?1(\.0)?\b|eps(ilon)?.{0,60}(too (large|big)|large|swamp|dominat)|"
                    r"sqrt\(v\).{0,40}eps)")
def kp_adam_eps_one(fixed=False):
    seed(0)
    x, kp = kp_data(1000, 2)
    vx, vkp = kp_data(250, 3)
    hm, vhm = heatmap(kp[:, 0], kp[:, 1]), heatmap(vkp[:, 0], vkp[:, 1])
    model = KpNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3, eps=1e-8 if fixed else 1.0),
                train_loader=loader(TensorDataset(x, kp, hm), 32),
                loss_fn=lambda m, b: F.mse_loss(m(b[0]), b[2]),
                val_loader=loader(TensorDataset(vx, vkp, vhm), 64, shuffle=False), max_steps=300)


fix("kp_adam_eps_one", fixed_of(kp_adam_eps_one), kp_metric(lambda m, b: (m(b[0]), b[1])), "val PCK")


@case("box_warmup_longer_than_run", "mechanics",
      bug="The LambdaLR linear warm-up is 10000 steps (copied from a COCO schedule) while the run is 300 steps, so "
          "the learning rate never exceeds 3% of its target and the box regressor stays near its start.",
      cause_pattern=r"(?i)(warm.?up.{0,80}(10000|10,000|longer than|exceeds|never (ends|finish|reach))|"
                    r"(10000|10,000).{0,40}warm.?up|learning rate never (reaches|exceeds).{0,40}(target|peak|base))")
def box_warmup_longer_than_run(fixed=False):
    seed(0)
    x, b = box_data(1200, 6)
    vx, vb = box_data(300, 7)
    model = BoxNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    warmup = 30 if fixed else 10000
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    return dict(model=model, optimizer=optimizer, scheduler=sched,
                train_loader=loader(TensorDataset(x, b), 32), loss_fn=nn.SmoothL1Loss(beta=0.05),
                val_loader=loader(TensorDataset(vx, vb), 64, shuffle=False), max_steps=300)


fix("box_warmup_longer_than_run", fixed_of(box_warmup_longer_than_run), box_metric(), "val mean IoU")


@case("elevation_bf16_absolute", "mechanics",
      bug="Terrain elevation is regressed in absolute metres (about 850 m, varying by a few metres) under bf16 "
          "autocast; bf16 has a spacing of 4 m at 850, so every prediction is rounded to 848/852 m and the "
          "few-metre variation cannot be fitted (fp32, or regressing the offset from the mean, fixes it).",
      cause_pattern=r"(?i)((bf16|bfloat16).{0,120}(spacing|round\w* to|quantis|quantiz|mantissa|absolute (metres|"
                    r"meters|elevation|values|targets)|850|848|852|\b4 ?m\b)|(absolute (metres|meters|elevation)|"
                    r"850 ?m).{0,80}(bf16|bfloat16)|regress\w* the offset from the mean)")
def elevation_bf16_absolute(fixed=False):
    seed(0)
    x, d = depth_data(800, 6)
    vx, vd = depth_data(200, 7)
    elev, velev = 847.0 + d.unsqueeze(1), 847.0 + vd.unsqueeze(1)     # 848-852 m
    model = DepthNet()
    with torch.no_grad():
        model.head.bias.fill_(850.0)                 # start at the mean elevation
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                precision="fp32" if fixed else "bf16",
                train_loader=loader(TensorDataset(x, elev), 32), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(vx, velev), 64, shuffle=False), max_steps=300)


def _bf16_rmse(model, kw):
    bf16 = kw.get("precision") == "bf16"
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return rmse_metric()(model, kw)


fix("elevation_bf16_absolute", fixed_of(elevation_bf16_absolute), _bf16_rmse, "val RMSE (m), own precision",
    higher=False)
