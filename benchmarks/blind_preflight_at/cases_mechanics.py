"""Mechanics: parameter groups, layer-wise learning rates, LoRA scaling, schedulers."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_at.registry import (  # noqa: F401
    FTNet,
    LoRALinear,
    Pairs,
    PointNet,
    Video3D,
    acc_of,
    case,
    fix,
    fixed_of,
    ft_loaders,
    loader,
    moving_blobs,
    point_clouds,
    seed,
)

ACC = acc_of(lambda m, b: (m(b[0]).argmax(1), b[1]))


@case("param_group_lr_key_typo", "mechanics",
      "The new head's parameter group is written {'params': head, 'learning_rate': 1e-2}; torch.optim keeps the "
      "unknown key silently and the group falls back to the optimizer's default lr=1e-5 meant for the backbone, so "
      "the randomly initialised head barely moves.",
      r"learning_rate|(unknown|unrecogni[sz]ed|misspel|typo|wrong|extra) (key|option|name)|"
      r"['\"]lr['\"].{0,40}(key|missing|instead)|(head|new).{0,60}(default lr|lr ?= ?1e-05|lr of 1e-05|"
      r"backbone'?s? (lr|learning rate))|(falls? back|defaults?) to.{0,40}(lr|learning rate)")
def param_group_lr_key_typo(fixed=False):
    seed(0)
    tr, va = ft_loaders(use_first=False)
    model = FTNet()
    key = "lr" if fixed else "learning_rate"
    opt = torch.optim.AdamW([{"params": model.backbone.parameters()},
                             {"params": model.head.parameters(), key: 1e-2}], lr=1e-5)
    return dict(model=model, optimizer=opt, train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss(),
                max_steps=200)


fix("param_group_lr_key_typo", fixed_of(param_group_lr_key_typo), ACC, "val accuracy")


def pretraining_checkpoint(model):
    """What the 'pretraining' run saved: the model and its optimizer at the end of a cosine decay (lr 1e-7)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-7)
    for p in model.parameters():
        opt.state[p] = {"step": torch.tensor(5000.0), "exp_avg": torch.zeros_like(p),
                        "exp_avg_sq": torch.full_like(p, 1e-6)}
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


@case("resumed_pretrain_optimizer_state", "mechanics",
      "Fine-tuning builds Adam(lr=3e-3) and then calls optimizer.load_state_dict(ckpt['optimizer']) from the "
      "pretraining checkpoint, which restores the param_groups' lr of 1e-7 from the end of pretraining, so the "
      "fine-tune runs at 1e-7 instead of 3e-3.",
      r"load_state_dict|(optimi[sz]er) (state|checkpoint).{0,80}(restor|overwr|load|carr)|"
      r"(restor|overwr|load|carr).{0,80}(lr|learning rate)|1e-07|1\.0e-07|(lr|learning rate).{0,60}"
      r"(pretrain|checkpoint|previous run)")
def resumed_pretrain_optimizer_state(fixed=False):
    seed(0)
    tr, va = ft_loaders(use_first=True)
    model = FTNet()
    ckpt = pretraining_checkpoint(FTNet())
    model.load_state_dict(ckpt["model"])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    if not fixed:
        opt.load_state_dict(ckpt["optimizer"])  # "resume everything from the checkpoint"
    return dict(model=model, optimizer=opt, train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss(),
                max_steps=200)


fix("resumed_pretrain_optimizer_state", fixed_of(resumed_pretrain_optimizer_state), ACC, "val accuracy")


@case("lora_scaling_integer_division", "mechanics",
      "The LoRA layer computes its scaling as alpha // r with alpha=2 and r=4, an integer division that gives 0, "
      "so the adapter's output is multiplied by zero and neither A nor B ever receives a gradient.",
      r"//|integer division|floor division|scal(ing|e).{0,60}(0\b|zero)|alpha ?/ ?r|"
      r"(adapter|lora).{0,80}(multiplied by (0|zero)|zero (output|gradient)|no gradient)")
def lora_scaling_integer_division(fixed=False):
    seed(0)
    tr, va = ft_loaders(use_first=True)
    model = FTNet()
    for p in model.backbone.parameters():
        p.requires_grad = False
    model.backbone.fc1 = LoRALinear(model.backbone.fc1, r=4, alpha=2, int_div=not fixed)
    params = [p for p in model.parameters() if p.requires_grad]
    return dict(model=model, optimizer=torch.optim.AdamW(params, 3e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("lora_scaling_integer_division", fixed_of(lora_scaling_integer_division), ACC, "val accuracy")


@case("lambdalr_returns_lr", "mechanics",
      "The warm-up LambdaLR's lambda returns a learning rate (2e-3 * min(1, step / 20)) instead of a multiplicative "
      "factor, so the optimizer's lr=2e-3 is multiplied by it and the point-cloud model trains at about 4e-6.",
      r"LambdaLR|lr_lambda|multiplicative factor|(factor|multiplier).{0,60}(not|instead of|rather than).{0,30}"
      r"(learning rate|lr)|(learning rate|lr).{0,60}(squared|multiplied (twice|by itself)|instead of a factor)|"
      r"4e-06|4\.0e-06")
def lambdalr_returns_lr(fixed=False):
    seed(0)
    pts, y, _ = point_clouds(1536, s=1)
    tr, va = loader(Pairs(pts[:1024], y[:1024]), 32), loader(Pairs(pts[1024:], y[1024:]), 128, shuffle=False)
    model = PointNet()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    if fixed:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 2e-3 * min(1.0, (s + 1) / 20))
    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("lambdalr_returns_lr", fixed_of(lambdalr_returns_lr), ACC, "val accuracy")


@case("warmup_sized_for_epochs", "mechanics",
      "The LinearLR warm-up is sized as total_iters = 100 epochs * len(train_loader) = 2400 steps while the run is "
      "max_steps=200, so the whole run stays in the first twelfth of the warm-up at under 10% of the base rate.",
      r"total_iters|warm-?up.{0,80}(longer than|exceeds|never (finish|reach|complet)|2400|sized|epochs)|"
      r"(max_steps|run).{0,60}(shorter|fewer|less) than.{0,40}(warm|schedul)|(lr|learning rate).{0,60}"
      r"(never reaches|stays? (below|under|small|tiny|low))")
def warmup_sized_for_epochs(fixed=False):
    seed(0)
    vid, y, _ = moving_blobs(1024, frames=6, s=2)
    vid = vid.permute(0, 4, 1, 2, 3).contiguous()
    tr, va = loader(Pairs(vid[:768], y[:768]), 32), loader(Pairs(vid[768:], y[768:]), 128, shuffle=False)
    model = Video3D()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    total = 20 if fixed else 100 * len(tr)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1e-3, total_iters=total)
    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=200)


fix("warmup_sized_for_epochs", fixed_of(warmup_sized_for_epochs), ACC, "val accuracy")
