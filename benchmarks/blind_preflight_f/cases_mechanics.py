"""Set f, family `mechanics`: optimizer / scheduler / accumulation / loss-scaling / clipping / precision mechanics."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_f.registry import case, loader, seed, teacher_classes, teacher_regression

# --------------------------------------------------------------------------- 1: static loss scale kept from an fp16 script


LOSS_SCALE = 128.0


def scaled_ce(model, batch):
    x, y = batch
    loss = F.cross_entropy(model(x), y)
    return loss * LOSS_SCALE


def mlp(d_in=16, classes=4, hidden=64):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes))


@case("sgd_static_loss_scale_never_unscaled", "mechanics",
      "the loss is multiplied by LOSS_SCALE = 128, the static loss scale of the apex-era fp16 script it came from, but "
      "the run is fp32 and nothing divides the gradients back: SGD(lr=0.05, momentum=0.9) takes steps 128x larger "
      "than tuned and the loss blows up instead of converging",
      r"loss.?scal|scal(ed|ing)? (up )?(the )?loss|unscal|(gradients?|grad.?norm|updates?|steps?)[^.]*(too (large|big|high)|explod|huge|\d+ ?x (too )?large)|(\blr\b|learning.?rate)[^.]*(too (high|large)|effective)")
def sgd_static_loss_scale_never_unscaled():
    seed(0)
    x, y = teacher_classes(3000, 16, 4, s=31)
    model = mlp()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=scaled_ce, max_steps=2000)


# --------------------------------------------------------------------------- 2: DP noise not divided by the batch size


NOISE_MULTIPLIER, MAX_GRAD_NORM = 1.0, 1.0


def add_dp_noise(optimizer, args, kwargs):
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad.add_(torch.randn_like(p.grad) * NOISE_MULTIPLIER * MAX_GRAD_NORM)


@case("dp_gradient_noise_not_divided_by_batch_size", "mechanics",
      "a hand-written DP-SGD adds Gaussian noise of std noise_multiplier * max_grad_norm = 1.0 to the batch-mean "
      "gradient in an optimizer step pre-hook; that std belongs to the sum of the 64 per-sample gradients, so on the "
      "mean it must be divided by the batch size: the noise is 64x too large, dwarfs the gradient (norm ~0.3 against "
      "~70) and the classifier does not learn",
      r"noise|(gradients?)[^.]*(random|noisy|dominat|swamp)|signal.to.noise|privacy|dp.?sgd|(batch.?size)[^.]*(divid|scal)|(pre.?)?hook[^.]*(grad|modif)")
def dp_gradient_noise_not_divided_by_batch_size():
    seed(0)
    x, y = teacher_classes(3000, 16, 4, s=32)
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    optimizer.register_step_pre_hook(add_dp_noise)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), clip_grad_norm=MAX_GRAD_NORM, max_steps=2000)


# --------------------------------------------------------------------------- 3: LR range test scheduler left in


@case("lr_range_test_scheduler_left_in_training", "mechanics",
      "the exponential LambdaLR of an LR range test (factor 10 ** (step / 60) from a base of 1e-5) is still the "
      "scheduler of the real run: the learning rate grows tenfold every 60 steps, passes the useful range after ~250 "
      "steps and reaches 1e+28 by the end of the 2000-step run, so SGD diverges",
      r"(\blr\b|learning.?rate)[^.]*(grow|increas|ris(es|ing)|explod|exponential|diverg|too (high|large)|\d+(\.\d+)?e\+\d+)|(increas|grow)\w*[^.]*(\blr\b|learning.?rate)|range test|lr.?finder|exponential")
def lr_range_test_scheduler_left_in_training():
    seed(0)
    x, y = teacher_classes(3000, 16, 4, s=33)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-5, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 10 ** (step / 60))
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=2000)


# --------------------------------------------------------------------------- 4: optimizer state of an annealed run


def regressor():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def reg_mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x).squeeze(-1), y)


def previous_run_optimizer_state(model, steps=50):
    """Stands in for 'optimizer' in the pre-training checkpoint: AdamW after a full cosine schedule."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    x, y = teacher_regression(512, 16, s=90)
    for i in range(steps):
        opt.zero_grad()
        reg_mse(model, (x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8])).backward()
        opt.step()
        sched.step()
    return opt.state_dict()


@case("finetune_restores_optimizer_state_with_annealed_lr", "mechanics",
      "the fine-tune builds AdamW(lr=1e-3) and then restores the pre-training checkpoint's optimizer state with "
      "optimizer.load_state_dict(...): the saved param_groups carry the lr the cosine schedule ended at (0), which "
      "replaces 1e-3, so every step is a step of size 0 and the model never moves from the checkpoint",
      r"(\blr\b|learning.?rate)[^.]*(zero|(?<![\d.])0(\.0+)?(?![\d.])|vanish|tiny|e-\d\d)|load_state_dict|checkpoint|resum|(updates?|steps?)[^.]*(zero|\b0\b|no effect|do not change|don't change)|(weights?|parameters?)[^.]*(unchanged|never (move|change|updat)|do not (move|change))")
def finetune_restores_optimizer_state_with_annealed_lr():
    seed(0)
    model = regressor()
    state = previous_run_optimizer_state(model)
    x, y = teacher_regression(3000, 16, s=34)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.load_state_dict(state)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=reg_mse, max_steps=2000)


# --------------------------------------------------------------------------- 5: linear decay sized for one epoch


def linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    def factor(step):
        if step < num_warmup_steps:
            return (step + 1) / num_warmup_steps
        return max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@case("linear_decay_schedule_sized_for_one_epoch", "mechanics",
      "the warmup + linear-decay schedule gets num_training_steps=len(train_loader), the 20 batches of one epoch, "
      "while the run trains 30 epochs (600 steps): the learning rate reaches 0 at step 20 and stays there, so 97% "
      "of the run changes nothing",
      r"(\blr\b|learning.?rate)[^.]*(zero|(?<![\d.])0(\.0+)?(?![\d.])|reach|decay|drops?|vanish|ends?)|num_training_steps|total (training )?steps|schedul\w*[^.]*(short|ends?|length|one epoch|sized|before the (end|run))|(steps?|epochs?)[^.]*(zero|(?<![\d.])0) (lr|learning.?rate)")
def linear_decay_schedule_sized_for_one_epoch():
    seed(0)
    x, y = teacher_classes(1000, 16, 4, s=35)
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    train_loader = loader(TensorDataset(x[:640], y[:640]), 32)
    scheduler = linear_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=len(train_loader))
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=train_loader,
                val_loader=loader(TensorDataset(x[640:], y[640:]), 120, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


# --------------------------------------------------------------------------- 6: bf16 weights, no fp32 master copy


def bf16_ce(model, batch):
    x, y = batch
    logits = model(x.to(torch.bfloat16))
    return F.cross_entropy(logits.float(), y)


@case("bf16_weights_adam_updates_rounded_away", "mechanics",
      "the model is cast with model.to(torch.bfloat16) 'to save memory' and trained with a plain AdamW at lr=2e-4: "
      "the weights themselves are bf16 (8 significant bits), so an update of ~2e-4 on a weight of ~0.1 is below half "
      "its spacing (~5e-4 / 2) and rounds away; most weights never change (keep fp32 master weights and use autocast)",
      r"bf16|bfloat16|half.precision|low.precision|(round|rounded|rounding)|master (weights|copy|param)|(updates?|steps?)[^.]*(smaller than|below|lost|vanish|swallow|absorb)|(float32|fp32) (master|copy|weights|param)|(weights?|parameters?)[^.]*dtype")
def bf16_weights_adam_updates_rounded_away():
    seed(0)
    x, y = teacher_classes(3000, 16, 4, s=36)
    model = mlp().to(torch.bfloat16)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.0),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 64),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=bf16_ce, max_steps=2000)


# --------------------------------------------------------------------------- 7: BatchNorm with micro-batches of 2


@case("batchnorm_mlp_micro_batches_of_2_accumulated_16x", "mechanics",
      "to 'fit memory' the BatchNorm MLP is trained with loader batches of 2 and accumulation_steps=16 (32 samples per "
      "step): BatchNorm normalises each micro-batch of 2 on its own, so every feature becomes +-1 (the sign of the "
      "difference of the two samples), the running statistics are those of pairs, and the model in eval mode does "
      "not match what was trained",
      r"batch.?norm|(statistic|stats)[^.]*(micro.?batch|2 samples|two samples|tiny batch|small batch|per batch)|(micro.?batch|batch)(es)? (size )?(of )?2\b|(micro.?batch|batch) size[^.]*(too small|2\b)|GroupNorm|LayerNorm")
def batchnorm_mlp_micro_batches_of_2_accumulated_16x():
    seed(0)
    x, y = teacher_classes(3000, 16, 4, s=37)
    x = x * 3 + 1
    model = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64), nn.BatchNorm1d(64),
                          nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2560], y[:2560]), 2),
                val_loader=loader(TensorDataset(x[2560:], y[2560:]), 110, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), accumulation_steps=16, max_steps=2000)
