"""Set h, family 'mechanics': optimizer, scheduler, AMP, accumulation and loop mechanics."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_h.registry import accuracy, case, fix, gen, loader, seed, teacher_classes, val_acc

# --------------------------------------------------------------------------------------------------------------
# M1: CosineAnnealingLR(eta_min=0.1) meant as 10% of the base LR


def clips(n, s):
    """(B, 8 mel bands, 32 frames) 'keyword' clips: a class-specific band pattern at a random time."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    patterns = torch.randn(4, 8, 4, generator=gen(201))
    x = 1.2 * torch.randn(n, 8, 32, generator=g)
    start = torch.randint(0, 28, (n,), generator=g)
    for i in range(n):
        x[i, :, start[i]:start[i] + 4] += patterns[y[i]]
    return x, y


def keyword_cnn():
    return nn.Sequential(nn.Conv1d(8, 32, 3, padding=1), nn.ReLU(), nn.Conv1d(32, 32, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveMaxPool1d(1), nn.Flatten(), nn.Linear(32, 4))


def _cosine(eta_as_ratio=True):
    seed(0)
    x, y = clips(1536, 202)
    vx, vy = clips(512, 203)
    model = keyword_cnn()
    base_lr = 1e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=base_lr)
    eta_min = 0.1 if eta_as_ratio else 0.1 * base_lr             # config: min_lr_ratio: 0.1
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=300, eta_min=eta_min)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False), loss_fn=nn.CrossEntropyLoss(),
                max_steps=300)


@case("keyword_cnn_cosine_eta_min_given_as_ratio", "mechanics",
      bug="the config's min_lr_ratio 0.1 (a fraction of the base LR, as in timm / HF's cosine_with_min_lr) is "
          "passed as CosineAnnealingLR(eta_min=0.1), which is an absolute learning rate: with Adam at lr 1e-3 the "
          "'annealing' RAISES the LR along a cosine to 0.1, a hundred times the base rate, and training blows up",
      cause_pattern=(r"eta_min|min(imum)?[_ ]lr|(schedule|scheduler|cosine).{0,80}(rises|increas|grows|goes up|above "
                    r"(the )?(base|initial))|(rises|increas\w*|grows) .{0,40}(learning rate|lr)\b.{0,40}"
                    r"(schedul|cosine)|absolute (learning rate|lr)"))
def keyword_cnn_cosine_eta_min_given_as_ratio():
    return _cosine(True)


fix("keyword_cnn_cosine_eta_min_given_as_ratio", lambda: _cosine(False), val_acc, "val accuracy",
    fact=lambda: (lambda kw: [kw["scheduler"].step() for _ in range(150)] and
                  print("  fact: LR at step 150 of the cosine:", f"{kw['optimizer'].param_groups[0]['lr']:.4f}"))(
                      _cosine(True)))

# --------------------------------------------------------------------------------------------------------------
# M2: the loss function also steps the scheduler (left from the hand-written loop)


def gauges(n, s):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    y = torch.sin(x[:, 0] * 2) + x[:, 1] * x[:, 2] + 0.5 * x[:, 3] ** 2 + 0.05 * torch.randn(n, generator=g)
    return x, y


def _sched_in_loss(step_in_loss=True):
    seed(0)
    x, y = gauges(4096, 211)
    vx, vy = gauges(1024, 212)
    model = nn.Sequential(nn.Linear(10, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1), nn.Flatten(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    total = 300
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / total))

    def loss_fn(model, batch):
        inputs, targets = batch
        loss = F.mse_loss(model(inputs), targets)
        if step_in_loss:
            scheduler.step()                                  # was after optimizer.step() in the old loop
        return loss

    return dict(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=loader(TensorDataset(x, y), 16),
                val_loader=loader(TensorDataset(vx, vy), 512, shuffle=False), loss_fn=loss_fn,
                accumulation_steps=4, max_steps=total)


@torch.no_grad()
def gauge_mse(model, kw):
    vx, vy = gauges(1024, 212)
    return F.mse_loss(model(vx), vy).item()


@case("gauges_loss_fn_also_steps_the_scheduler", "mechanics",
      bug="the loss function still calls scheduler.step() (it sat after optimizer.step() in the old hand-written "
          "loop), while the scheduler is also passed to be stepped per optimizer step: with accumulation_steps=4 "
          "the linear decay advances 5 times per optimizer step and reaches LR 0 after a fifth of the run",
      cause_pattern=r"scheduler\.step\(\)|(scheduler|schedule|lr_scheduler).{0,80}(stepped|steps|advanc\w*|called).{0,60}"
                    r"(twice|more than once|per micro-?batch|times per|inside|loss)|(stepped|advanc\w*) (twice|\d+ times|"
                    r"too (often|fast))|(inside|in) the loss (function|fn)")
def gauges_loss_fn_also_steps_the_scheduler():
    return _sched_in_loss(True)


fix("gauges_loss_fn_also_steps_the_scheduler", lambda: _sched_in_loss(False), gauge_mse, "val MSE", higher=False)

# --------------------------------------------------------------------------------------------------------------
# M3: a hand-written momentum SGD that `return`s at the first parameter without a gradient


class MomentumSGD(torch.optim.Optimizer):
    def __init__(self, params, lr=0.05, momentum=0.9, skip_with_return=True):
        super().__init__(params, dict(lr=lr, momentum=momentum))
        self.skip_with_return = skip_with_return

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    if self.skip_with_return:
                        return None
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad)
                p.add_(buf, alpha=-group["lr"])
        return None


class ReviewNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.char_emb = nn.Embedding(64, 8)          # char features: switched off in this experiment
        self.use_chars = False
        self.bag = nn.EmbeddingBag(300, 32, mode="mean")
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x):
        return self.head(self.bag(x))


def reviews3(n, s):
    g = gen(s)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randint(30, 300, (n, 16), generator=g)
    for k in range(3):
        x[torch.arange(n), torch.randint(0, 16, (n,), generator=g)] = y * 10 + torch.randint(0, 10, (n,), generator=g)
    return x, y


def _custom_sgd(skip_with_return=True):
    seed(0)
    x, y = reviews3(2048, 221)
    vx, vy = reviews3(512, 222)
    model = ReviewNet()
    return dict(model=model, optimizer=MomentumSGD(model.parameters(), lr=0.5, skip_with_return=skip_with_return),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


@case("reviews_custom_sgd_returns_at_first_gradless_param", "mechanics",
      bug="the hand-written MomentumSGD.step() skips parameters without a gradient with `return` instead of "
          "`continue`: the first parameter of the model, the unused char_emb table, has grad None, so step() "
          "leaves at once on every call and no parameter is ever updated",
      cause_pattern=(r"\breturn\b.{0,40}continue|continue.{0,40}\breturn\b|step\(\).{0,80}(returns|exits|leaves|early)|"
                    r"(custom|hand-written) optimi[sz]er|MomentumSGD|char_emb"))
def reviews_custom_sgd_returns_at_first_gradless_param():
    return _custom_sgd(True)


fix("reviews_custom_sgd_returns_at_first_gradless_param", lambda: _custom_sgd(False), val_acc, "val accuracy",
    fact=lambda: print("  fact: first parameter:", next(iter(ReviewNet().named_parameters()))[0]))

# --------------------------------------------------------------------------------------------------------------
# M4: bf16 autocast on raw sensor readings with a large offset


def plant(n, s, standardise):
    g = gen(s)
    signal = torch.randn(n, 8, generator=g)
    y = (signal @ torch.randn(8, 3, generator=gen(231))).argmax(1)
    x = 1013.0 + signal * 1.5                            # raw pressure-like readings (hPa)
    if standardise:
        x = (x - 1013.0) / 1.5                           # the train-set mean / std
    return x, y


def _bf16(standardise=False):
    seed(0)
    x, y = plant(2048, 232, standardise)
    vx, vy = plant(512, 233, standardise)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), precision="bf16", max_steps=300)


@torch.no_grad()
def bf16_acc(model, kw):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return accuracy(model, kw["val_loader"])


@case("plant_sensors_bf16_autocast_on_raw_offset_readings", "mechanics",
      bug="the run uses precision='bf16' on raw pressure readings around 1013 hPa with a spread of ~1.5: under "
          "autocast the first Linear casts them to bfloat16, whose 8 significant bits space the numbers near 1000 "
          "by 4 or 8, so the signal is rounded away before the model sees it; standardising the inputs (or fp32 "
          "for that layer) keeps it",
      cause_pattern=(r"(bf16|bfloat16|autocast|half precision|reduced precision).{0,100}(round|resolution|quanti[sz]|"
                    r"precision loss|mantissa|significant|lost|offset|large (values|magnitude))|(round|resolution|quanti[sz]|"
                    r"lost).{0,80}(bf16|bfloat16)|mantissa|significant bits"))
def plant_sensors_bf16_autocast_on_raw_offset_readings():
    return _bf16(False)


fix("plant_sensors_bf16_autocast_on_raw_offset_readings", lambda: _bf16(True), bf16_acc, "val accuracy (bf16)",
    fact=lambda: print("  fact: bf16 of 1012.3, 1013.0, 1014.4 ->",
                       torch.tensor([1012.3, 1013.0, 1014.4]).bfloat16().float().tolist()))

# --------------------------------------------------------------------------------------------------------------
# M5: decoupled weight decay in a step pre-hook without the learning-rate factor


def _decay_hook(with_lr=False):
    seed(0)
    x, y = teacher_classes(2560, 16, 5, s=241)
    vx, vy, x, y = x[2048:], y[2048:], x[:2048], y[:2048]
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    weight_decay = 0.05

    def decoupled_decay(opt, args, kwargs):              # 'AdamW-style decay, only on matrices'
        with torch.no_grad():
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.ndim > 1:
                        p.mul_(1 - (group["lr"] * weight_decay if with_lr else weight_decay))

    optimizer.register_step_pre_hook(decoupled_decay)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False), loss_fn=nn.CrossEntropyLoss(),
                max_steps=300)


@case("teacher_mlp_decay_hook_without_lr_factor", "mechanics",
      bug="decoupled weight decay is added with an optimizer step pre-hook doing p.mul_(1 - weight_decay) with "
          "weight_decay=0.05; AdamW's rule is p *= 1 - lr * weight_decay, so without the lr factor every weight "
          "matrix shrinks by 5% per step (1000x the intended decay) and the weights are held near zero",
      cause_pattern=(r"(decay|shrink)\w*.{0,80}(hook|without (the )?(lr|learning rate)|lr ?\* ?weight_decay|per step|every step)|"
                    r"register_step_pre_hook|pre-?hook|mul_\(1 ?- ?weight_decay|lr factor|(multipl|scal)\w* by (the )?"
                    r"(lr|learning rate)"))
def teacher_mlp_decay_hook_without_lr_factor():
    return _decay_hook(False)


fix("teacher_mlp_decay_hook_without_lr_factor", lambda: _decay_hook(True), val_acc, "val accuracy")

# --------------------------------------------------------------------------------------------------------------
# M6: the loss function returns the smoothed loss it logs


class SmoothedCE:
    """Cross-entropy with an exponentially smoothed value for the progress bar."""

    def __init__(self, return_smoothed=True):
        self.smoothed = None
        self.return_smoothed = return_smoothed

    def __call__(self, model, batch):
        x, y = batch
        loss = F.cross_entropy(model(x), y)
        self.smoothed = loss if self.smoothed is None else 0.98 * self.smoothed.detach() + 0.02 * loss
        return self.smoothed if self.return_smoothed else loss


def _smoothed(return_smoothed=True):
    seed(0)
    x, y = teacher_classes(2560, 20, 6, s=251)
    vx, vy, x, y = x[2048:], y[2048:], x[:2048], y[:2048]
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 6))
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 256, shuffle=False),
                loss_fn=SmoothedCE(return_smoothed), max_steps=300)


@case("teacher_mlp_loss_fn_returns_smoothed_logging_loss", "mechanics",
      bug="the loss function returns self.smoothed = 0.98 * previous.detach() + 0.02 * loss, the exponentially "
          "smoothed value it keeps for the progress bar, instead of the batch loss: only the 0.02 * loss term "
          "carries a gradient, so every SGD update is 50 times smaller than intended",
      cause_pattern=(r"smoothed (loss|value)|exponential(ly)? (moving )?(average|smooth)|\bEMA\b|running (mean|average)|"
                    r"0\.02 ?\*|(50|fifty) ?(x|times) (smaller|too small)|(returns?|returned) .{0,60}(logg|progress|display)|"
                    r"previous.{0,20}detach"))
def teacher_mlp_loss_fn_returns_smoothed_logging_loss():
    return _smoothed(True)


fix("teacher_mlp_loss_fn_returns_smoothed_logging_loss", lambda: _smoothed(False), val_acc, "val accuracy")
