"""Set i, mechanics: optimizer, scheduler, clipping, accumulation and the loop's arguments (6 broken cases)."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_i.cases_targets import _bars
from benchmarks.blind_preflight_i.cases_trained import _radial_table
from benchmarks.blind_preflight_i.registry import case, fix, gen, loader, seed, val_acc


# --------------------------------------------------------------------------------------------------------------------
# 1. Linear-decay LambdaLR written as `lambda step: 1 - step / decay_steps` with decay_steps sized for 3 epochs
#    while the run is max_steps=300: after step 150 the factor is negative, the learning rate is negative, and Adam
#    climbs the loss for the second half of the run.
# --------------------------------------------------------------------------------------------------------------------
def _load_windows(n: int, s: int):
    g = gen(s)
    t0 = torch.rand(n, 1, generator=g) * 24
    hours = t0 + torch.arange(25)
    level = 1 + 0.5 * torch.rand(n, 1, generator=g)
    series = level * torch.sin(2 * math.pi * hours / 24) + 0.3 * torch.sin(2 * math.pi * hours / 6)
    series = series + 0.05 * torch.randn(n, 25, generator=g)
    return series[:, :24], series[:, 24]


class LoadMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@torch.no_grad()
def load_rmse(model, kw):
    x, y = _load_windows(600, 2)
    model.eval()
    err = (model(x) - y).pow(2).mean().sqrt().item()
    model.train()
    return err


@case("grid_load_linear_decay_lambda_goes_negative", "mechanics",
      bug="the linear decay is LambdaLR(lambda step: 1 - step / decay_steps) with decay_steps = len(train_loader) * 3 "
          "epochs = 150 while the run is 300 optimizer steps: nothing clamps the factor at 0, so after step 150 the "
          "learning rate is negative and Adam walks uphill on the loss for the rest of the run "
          "(max(0.0, 1 - step / total) with the run's step count was meant)",
      cause_pattern=r"negative (learning rate|\blr\b)|(learning rate|\blr\b|factor)[^.]*(negative|below (zero|0)|"
                    r"< ?0)|lr_lambda|LambdaLR|max\(0|clamp\w*[^.]*(factor|\blr\b|learning rate)|decay_steps|"
                    r"(schedule|decay)[^.]*(shorter than|ends before)|gradient ascent|uphill")
def grid_load_linear_decay_lambda_goes_negative(clamped=False):
    seed(0)
    train = TensorDataset(*_load_windows(1600, 1))
    val = TensorDataset(*_load_windows(400, 2))
    model = LoadMLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    train_loader = loader(train, 32)
    decay_steps = len(train_loader) * 3
    if clamped:
        decay_steps = 300
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / decay_steps))
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / decay_steps)
    return dict(model=model, optimizer=optimizer, train_loader=train_loader, scheduler=scheduler, max_steps=300,
                val_loader=loader(val, 200, shuffle=False), loss_fn=nn.MSELoss())


def _negative_lr_fact():
    kw = grid_load_linear_decay_lambda_goes_negative()
    lrs = []
    for _ in range(300):
        kw["optimizer"].step()
        kw["scheduler"].step()
        lrs.append(kw["optimizer"].param_groups[0]["lr"])
    print(f"  learning rate at steps 100, 150, 200, 299: {[f'{lrs[i]:.1e}' for i in (100, 150, 200, 299)]}")


fix("grid_load_linear_decay_lambda_goes_negative", partial(grid_load_linear_decay_lambda_goes_negative, clamped=True),
    load_rmse, "val RMSE", _negative_lr_fact, higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 2. Cosine decay given to MultiplicativeLR instead of LambdaLR: MultiplicativeLR multiplies the CURRENT learning
#    rate by the lambda's value at every step, so the cosine factors compound and the LR is ~0 after a third of the run.
# --------------------------------------------------------------------------------------------------------------------
LM_VOCAB, LM_T = 48, 24


def _progressions(n: int, s: int):
    g = gen(s)
    start = torch.randint(0, LM_VOCAB - 1, (n, 1), generator=g)
    step = torch.randint(1, 6, (n, 1), generator=g)
    return (start + step * torch.arange(LM_T)) % (LM_VOCAB - 1) + 1


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=LM_VOCAB, n_positions=LM_T, n_embd=48, n_layer=2, n_head=2,
                                      bos_token_id=0, eos_token_id=0))


def lm_batches(ids: torch.Tensor, batch: int, shuffle: bool = True):
    rows = [{"input_ids": r, "labels": r} for r in ids]
    return loader(rows, batch, shuffle=shuffle)


@torch.no_grad()
def next_token_accuracy(model, kw):
    ids = _progressions(300, 2)
    model.eval()
    pred = model(input_ids=ids).logits[:, 1:-1].argmax(-1)
    model.train()
    return (pred == ids[:, 2:]).float().mean().item()


@case("gpt2_cosine_factor_given_to_multiplicative_lr", "mechanics",
      bug="the cosine decay lambda 0.5 * (1 + cos(pi * step / max_steps)) is given to MultiplicativeLR instead of "
          "LambdaLR: MultiplicativeLR multiplies the current learning rate by the lambda's value at every step, so "
          "the factors compound (their product, not the cosine) and the learning rate is ~0 after a third of the run",
      cause_pattern=r"MultiplicativeLR|multiplicative|compound|cumulative (product|factor)|product of[^.]*factors|"
                    r"LambdaLR|(learning rate|\blr\b)[^.]*(collapses?|decays?|drops?|falls?|"
                    r"shrinks?)[^.]*(too (fast|early|quickly)|to (~ ?)?(0|zero)|within|after \d+|long before)")
def gpt2_cosine_factor_given_to_multiplicative_lr(scheduler_cls=torch.optim.lr_scheduler.MultiplicativeLR):
    seed(0)
    model = tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    max_steps = 300
    scheduler = scheduler_cls(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / max_steps)))
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, max_steps=max_steps,
                train_loader=lm_batches(_progressions(1200, 1), 32),
                val_loader=lm_batches(_progressions(300, 2), 100, shuffle=False), loss_fn=None)


def _multiplicative_fact():
    p = nn.Parameter(torch.zeros(1))
    for cls in (torch.optim.lr_scheduler.MultiplicativeLR, torch.optim.lr_scheduler.LambdaLR):
        opt = torch.optim.SGD([p], lr=1.0)
        sch = cls(opt, lambda step: 0.5 * (1 + math.cos(math.pi * step / 300)))
        lrs = []
        for _ in range(300):
            opt.step()
            sch.step()
            lrs.append(opt.param_groups[0]["lr"])
        print(f"  {cls.__name__}: lr factor at steps 50, 100, 150: {[f'{lrs[i]:.1e}' for i in (50, 100, 150)]}")


fix("gpt2_cosine_factor_given_to_multiplicative_lr",
    partial(gpt2_cosine_factor_given_to_multiplicative_lr, scheduler_cls=torch.optim.lr_scheduler.LambdaLR),
    next_token_accuracy, "val next-token accuracy", _multiplicative_fact)


# --------------------------------------------------------------------------------------------------------------------
# 3. NFNet-style adaptive gradient clipping (unit-wise, relative to the weight norm) applied to every parameter,
#    including the zero-initialised classifier: its clip is clip * max(0, eps) = 1e-5, so the head stays ~0.
# --------------------------------------------------------------------------------------------------------------------
class NFCNN(nn.Module):
    """Normaliser-free CNN (no BatchNorm), classifier zero-initialised as in NFNets."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                      nn.Flatten())
        self.fc = nn.Linear(32, 4)
        nn.init.zeros_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x):
        return self.fc(self.features(x))


def unitwise_norm(t: torch.Tensor) -> torch.Tensor:
    if t.ndim <= 1:
        return t.abs()
    return t.pow(2).sum(dim=tuple(range(1, t.ndim)), keepdim=True).sqrt()


def adaptive_grad_clip(params, clip: float = 0.01, eps: float = 1e-3):
    params = list(params)

    def hook(optimizer, args, kwargs):
        with torch.no_grad():
            for p in params:
                if p.grad is None:
                    continue
                max_norm = clip * unitwise_norm(p).clamp(min=eps)
                g_norm = unitwise_norm(p.grad).clamp(min=1e-6)
                p.grad.mul_(torch.where(g_norm > max_norm, max_norm / g_norm, torch.ones_like(g_norm)))
    return hook


@case("nfnet_adaptive_clipping_on_zero_initialised_head", "mechanics",
      bug="adaptive gradient clipping (NFNet AGC, clip 0.01 of each unit's weight norm) is applied to every "
          "parameter, including the zero-initialised classifier: its weight norm is 0, so its gradients are "
          "clipped to 0.01 * eps = 1e-5 per unit and the head, which starts at zero, never grows (the NFNet paper "
          "leaves the final linear layer out of AGC)",
      cause_pattern=r"AGC|adaptive (gradient )?clip|unit.?wise|clip\w*[^.]*(head|classifier|zero.?init\w*|"
                    r"weight norm)|(head|classifier|fc)[^.]*clip|zero.?initiali[sz]ed (head|classifier|"
                    r"layer)[^.]*(never|not|stays?|stuck)")
def nfnet_adaptive_clipping_on_zero_initialised_head(exclude_head=False):
    seed(0)
    train = TensorDataset(*_bars(1600, 1))
    val = TensorDataset(*_bars(400, 2))
    model = NFCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    clipped = model.features.parameters() if exclude_head else model.parameters()
    optimizer.register_step_pre_hook(adaptive_grad_clip(clipped))
    return dict(model=model, optimizer=optimizer, train_loader=loader(train, 32),
                val_loader=loader(val, 200, shuffle=False), loss_fn=nn.CrossEntropyLoss())


def _agc_fact():
    w = torch.zeros(4, 32)
    print(f"  AGC clip for a zero weight row: {0.01 * unitwise_norm(w).clamp(min=1e-3).flatten()[0].item():.0e} "
          f"per unit (a 0.1-norm row: {0.01 * 0.1:.0e})")


fix("nfnet_adaptive_clipping_on_zero_initialised_head",
    partial(nfnet_adaptive_clipping_on_zero_initialised_head, exclude_head=True), val_acc, "val accuracy", _agc_fact)


# --------------------------------------------------------------------------------------------------------------------
# 4. Rprop (MATLAB's trainrp habit) on shuffled mini-batches: Rprop adapts each weight's step from the SIGN agreement
#    of consecutive gradients, which mini-batch noise flips constantly; every flip halves the step.
# --------------------------------------------------------------------------------------------------------------------
class RadialMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, x):
        return self.net(x)


@case("sensor_mlp_rprop_on_shuffled_minibatches", "mechanics",
      bug="the MLP is trained with torch.optim.Rprop (the MATLAB trainrp habit) on shuffled mini-batches of 32: Rprop "
          "is a full-batch method that grows or halves each weight's step by whether consecutive gradients agree in "
          "sign, and mini-batch noise flips the signs constantly, so the steps shrink towards their minimum and "
          "training stalls (Adam / SGD, or Rprop on full batches)",
      cause_pattern=r"Rprop|resilient|full.?batch|sign (agreement|of (consecutive|successive))|(consecutive|"
                    r"successive) gradients?[^.]*sign")
def sensor_mlp_rprop_on_shuffled_minibatches(optimizer_cls=torch.optim.Rprop):
    seed(0)
    x, y = _radial_table(2000, 1)
    xv, yv = _radial_table(500, 2)
    model = RadialMLP()
    optimizer = optimizer_cls(model.parameters(), lr=1e-2) if optimizer_cls is torch.optim.Rprop else \
        optimizer_cls(model.parameters(), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(TensorDataset(x, y), 32),
                val_loader=loader(TensorDataset(xv, yv), 250, False), loss_fn=nn.CrossEntropyLoss())


def _rprop_fact():
    kw = sensor_mlp_rprop_on_shuffled_minibatches()
    model, opt = kw["model"], kw["optimizer"]
    batches = iter(kw["train_loader"])
    for _ in range(40):
        x, y = next(batches)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    steps = torch.cat([opt.state[p]["step_size"].flatten() for p in model.parameters()])
    print(f"  Rprop step sizes after 40 mini-batches: median {steps.median().item():.1e}, "
          f"{(steps <= 1e-5).float().mean().item():.0%} at <= 1e-5 (start 1e-2)")


fix("sensor_mlp_rprop_on_shuffled_minibatches",
    partial(sensor_mlp_rprop_on_shuffled_minibatches, optimizer_cls=torch.optim.Adam), val_acc, "val accuracy",
    _rprop_fact)


# --------------------------------------------------------------------------------------------------------------------
# 5. The loop's clip_grad_norm=0.0, meant as "off" (the config convention max_grad_norm: 0 = no clipping): the loop
#    clips to a norm of 0, so every gradient is scaled to zero before every step.
# --------------------------------------------------------------------------------------------------------------------
@case("churn_mlp_clip_grad_norm_zero_meant_as_off", "mechanics",
      bug="clip_grad_norm=0.0 is passed to the loop meaning 'no clipping' (the config's max_grad_norm: 0 = off), but "
          "the loop clips with clip_grad_norm_(params, 0.0): every gradient is scaled to norm 0 before every "
          "optimizer step and the weights never move (None disables clipping)",
      cause_pattern=r"clip_grad_norm\S*\s*(=|of|is)?\s*0(\.0)?(?![.\d])|max_?(grad_?)?norm\S*\s*(=|of|"
                    r"is)?\s*0(\.0)?(?![.\d])|clip\w*[^.]*(to|at) (a (max(imum)? )?norm of )?(0|"
                    r"zero)(\.0)?(?![.\d])|(norm|threshold) of (0|zero)(\.0)?(?![.\d])|0 (means|meaning|as|"
                    r"for) (off|no clipping|disabled)|(gradients?|updates?)[^.]*(scaled|clipped) to (0|"
                    r"zero)(\.0)?(?![.\d])")
def churn_mlp_clip_grad_norm_zero_meant_as_off(max_grad_norm=0.0):
    seed(0)
    x, y = _radial_table(2000, 1)
    xv, yv = _radial_table(500, 2)
    model = RadialMLP()
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 250, False),
                loss_fn=nn.CrossEntropyLoss(), clip_grad_norm=max_grad_norm)


def _clip_fact():
    p = nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([1.0, -2.0, 3.0])
    torch.nn.utils.clip_grad_norm_([p], 0.0)
    print(f"  clip_grad_norm_(params, 0.0) turns the gradient [1, -2, 3] into {p.grad.tolist()}")


fix("churn_mlp_clip_grad_norm_zero_meant_as_off", partial(churn_mlp_clip_grad_norm_zero_meant_as_off,
                                                          max_grad_norm=None), val_acc, "val accuracy", _clip_fact)


# --------------------------------------------------------------------------------------------------------------------
# 6. Layer-wise LR decay with the factor written as 0.1 ("decay 10% per layer") instead of 0.9: the groups get
#    lr * 0.1 ** depth, so the embeddings and the lower blocks of this from-scratch transformer run at 1e-5 .. 1e-7
#    of the head's rate and stay at their random init.
# --------------------------------------------------------------------------------------------------------------------
def _order_sequences(n: int, s: int):
    """Does token A (id 2) come before token B (id 3)? Filler ids 4..29, one A and one B per sequence."""
    g = gen(s)
    ids = torch.randint(4, 30, (n, 16), generator=g)
    y = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        a, b = torch.randperm(16, generator=g)[:2].tolist()
        ids[i, a], ids[i, b] = 2, 3
        y[i] = int(a < b)
    return ids, y


class OrderTransformer(nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.emb = nn.Embedding(30, d)
        self.pos = nn.Parameter(torch.randn(1, 16, d) * 0.1)
        self.blocks = nn.ModuleList([nn.TransformerEncoderLayer(d, 2, 64, dropout=0.0, batch_first=True)
                                     for _ in range(3)])
        self.head = nn.Linear(d, 2)

    def forward(self, ids):
        h = self.emb(ids) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(h.mean(1))


def llrd_groups(model: OrderTransformer, lr: float, decay: float):
    groups = [{"params": list(model.head.parameters()), "lr": lr}]
    n = len(model.blocks)
    for i, block in enumerate(model.blocks):
        groups.append({"params": list(block.parameters()), "lr": lr * decay ** (n - i)})
    groups.append({"params": list(model.emb.parameters()) + [model.pos], "lr": lr * decay ** (n + 1)})
    return groups


@case("order_transformer_layerwise_lr_decay_factor_inverted", "mechanics",
      bug="layer-wise learning-rate decay is configured as layer_decay=0.1 ('decay 10% per layer') instead of 0.9: "
          "the parameter groups get lr * 0.1 ** depth, so the top block runs at 1/10 of the head's rate and the "
          "embeddings and positions at 1e-4 of it; in this from-scratch transformer they stay at their random init",
      cause_pattern=r"layer.?wise|layer_decay|LLRD|decay (factor|rate)[^.]*(0\.1|per layer)|0\.1 ?\*\* ?|"
                    r"param(eter)? groups?[^.]*(tiny|very (low|small)|1e-[5-9]|much (lower|smaller))|(embedding|"
                    r"lower|bottom|first)[^.]*(learning rate|lr)[^.]*(tiny|very (low|small)|1e-[5-9]|much (lower|"
                    r"smaller)|orders? of magnitude)")
def order_transformer_layerwise_lr_decay_factor_inverted(layer_decay=0.1):
    seed(0)
    train = TensorDataset(*_order_sequences(2000, 1))
    val = TensorDataset(*_order_sequences(500, 2))
    model = OrderTransformer()
    optimizer = torch.optim.AdamW(llrd_groups(model, 2e-3, layer_decay), lr=2e-3)
    return dict(model=model, optimizer=optimizer, train_loader=loader(train, 32),
                val_loader=loader(val, 250, shuffle=False), loss_fn=nn.CrossEntropyLoss())


def _llrd_fact():
    kw = order_transformer_layerwise_lr_decay_factor_inverted()
    lrs = [f"{g['lr']:.0e}" for g in kw["optimizer"].param_groups]
    print(f"  group learning rates (head, block 0, block 1, block 2, embeddings + positions): {lrs}")


fix("order_transformer_layerwise_lr_decay_factor_inverted",
    partial(order_transformer_layerwise_lr_decay_factor_inverted, layer_decay=0.9), val_acc, "val accuracy",
    _llrd_fact)
