"""Family ``mechanics``: schedulers, loss reduction, the graph of the loss, activations a loss already applies."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_k.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    loader,
    rmse_of,
    seed,
    split,
    teacher_classes,
    teacher_regression,
)

_argmax = acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1]))


# --- 1. an epoch-based StepLR stepped every optimizer step ------------------------------------------------------------
def fraud_steplr_per_batch(fixed: bool = False):
    seed(0)
    x, y = teacher_classes(2000, 20, 6, s=211)
    (xt, yt), (xv, yv) = split(x, y, 1600)
    train_loader = loader(TensorDataset(xt, yt), batch_size=50)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 6))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # "halve the LR every 10 epochs" -- but the loop calls scheduler.step() after every optimizer step
    step_size = 10 * len(train_loader) if fixed else 10
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=step_size, gamma=0.5)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler, train_loader=train_loader,
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=320)


case("fraud_steplr_per_batch", "mechanics",
     "StepLR(step_size=10, gamma=0.5) was written for epochs but is stepped after every optimizer step, so the LR "
     "halves every 10 batches and is ~1e-9 of its value by step 300: training stalls after a few dozen steps; "
     "use step_size = 10 * len(train_loader) (or step the scheduler once per epoch).",
     r"StepLR|step_size|per (batch|iteration|optimi[sz]er step).{0,80}(epoch|schedul)|"
     r"(epoch|schedul)\w*.{0,80}(every|each|per) (batch|iteration|optimi[sz]er step)|"
     r"(LR|learning rate) (decays?|falls?|drops?|shrinks?|collapses?) .{0,60}(to|by|below) (~ ?)?\d|"
     r"(decays?|halv\w+) (too )?(fast|quickly|early)|(lr|learning rate).{0,40}(will be|reaches|ends at) .{0,12}e-\d",
     )(fraud_steplr_per_batch)
fix("fraud_steplr_per_batch", fixed_of(fraud_steplr_per_batch), _argmax, "val accuracy", steps=300)


# --- 2. numpy loss re-wrapped with torch.tensor(..., requires_grad=True) ---------------------------------------------
def demand_loss_rewrapped(fixed: bool = False):
    seed(0)
    x, y = teacher_regression(1500, 12, s=221)
    y = 3.0 + y
    (xt, yt), (xv, yv) = split(x, y, 1200)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
    q = 0.5

    def pinball_loss(model, batch):
        x, y = batch
        pred = model(x).squeeze(-1)
        if fixed:
            err = y - pred
            return torch.maximum(q * err, (q - 1) * err).mean()
        err = (y - pred).detach().cpu().numpy()                  # numpy port of the R metric
        loss = np.mean(np.maximum(q * err, (q - 1) * err))
        # "element 0 of tensors does not require grad" -> so:
        return torch.tensor(loss, requires_grad=True, device=pred.device)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(xt, yt), batch_size=50),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=pinball_loss, max_steps=300)


case("demand_loss_rewrapped", "mechanics",
     "The pinball loss is computed in numpy from a detached prediction and returned as torch.tensor(loss, "
     "requires_grad=True): that is a new leaf tensor with no grad_fn, cut from the model's graph, so backward() "
     "gives the model no gradient and the weights never move; compute the loss with torch ops on the prediction.",
     r"torch\.tensor\(.{0,40}requires_grad|new (leaf )?tensor|leaf tensor|grad_fn|(cut|detached|disconnected) "
     r"from (the )?(model'?s? )?(autograd |computation )?graph|\.numpy\(\)|\.item\(\)|\.detach\(\)|"
     r"(does not|doesn't) depend on (the )?(model|parameters)|not connected to the (model|parameters)",
     )(demand_loss_rewrapped)
fix("demand_loss_rewrapped", fixed_of(demand_loss_rewrapped),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", steps=250, higher=False)


# --- 3. softmax layer in front of CrossEntropyLoss ---------------------------------------------------------------------
def species_softmax_then_ce(fixed: bool = False):
    seed(0)
    x, y = teacher_classes(2400, 24, 20, s=231)
    (xt, yt), (xv, yv) = split(x, y, 2000)
    layers = [nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 20)]
    if not fixed:
        layers.append(nn.Softmax(dim=1))                          # "the model should output probabilities"
    model = nn.Sequential(*layers)
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                train_loader=loader(TensorDataset(xt, yt), batch_size=50),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("species_softmax_then_ce", "mechanics",
     "The model ends in nn.Softmax(dim=1) and its probabilities go into nn.CrossEntropyLoss, which applies "
     "log_softmax itself: softmax is applied twice, the loss is squashed into a narrow band and its gradients "
     "nearly vanish; drop the final Softmax and feed raw logits.",
     r"nn\.Softmax|softmax.{0,60}(twice|double|again|CrossEntropy)|CrossEntropy\w*.{0,100}(already )?(applies|"
     r"includes|contains|does) (a |the )?(log[_-]?)?softmax|double softmax|remove (the )?(final |last )?softmax|"
     r"(drop|remove) the (final |last )?(activation|softmax)",
     )(species_softmax_then_ce)
fix("species_softmax_then_ce", fixed_of(species_softmax_then_ce), _argmax, "val accuracy", steps=250)


# --- 4. LambdaLR lambda returns an LR instead of a factor --------------------------------------------------------------
def ticket_lambdalr_absolute(fixed: bool = False):
    seed(0)
    x, y = teacher_classes(1600, 16, 5, s=241)
    (xt, yt), (xv, yv) = split(x, y, 1280)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 5))
    base_lr = 3e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=base_lr)
    if fixed:
        schedule = lambda step: 0.98 ** (step / 10)              # noqa: E731
    else:
        schedule = lambda step: base_lr * 0.98 ** (step / 10)    # noqa: E731  "the LR at this step"
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=schedule)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(xt, yt), batch_size=64),
                val_loader=loader(TensorDataset(xv, yv), batch_size=100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("ticket_lambdalr_absolute", "mechanics",
     "The LambdaLR lambda returns the learning rate itself (3e-3 * decay) although LambdaLR multiplies the "
     "optimizer's base lr by what it returns, so the effective LR is 3e-3 * 3e-3 = 9e-6 and the model barely "
     "trains; return only the multiplicative factor (0.98 ** (step / 10)).",
     r"LambdaLR|lr_lambda|multiplicative factor|multiplier|(factor|multiplied) (of|on|by|times) the (base|initial|"
     r"optimi[sz]er'?s?) (lr|learning rate)|base[_ ]lr ?\*|squared|9e-0?6",
     )(ticket_lambdalr_absolute)
fix("ticket_lambdalr_absolute", fixed_of(ticket_lambdalr_absolute), _argmax, "val accuracy", steps=250)


# --- 5. summed loss with an SGD learning rate tuned for the mean --------------------------------------------------------
def energy_sum_reduction_sgd(fixed: bool = False):
    seed(0)
    x, y = teacher_regression(2000, 10, s=251)
    y = y.unsqueeze(1)
    (xt, yt), (xv, yv) = split(x, y, 1600)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(xt, yt), batch_size=128),
                val_loader=loader(TensorDataset(xv, yv), batch_size=200, shuffle=False),
                loss_fn=nn.MSELoss(reduction="mean" if fixed else "sum"), max_steps=300)


case("energy_sum_reduction_sgd", "mechanics",
     "The loss is nn.MSELoss(reduction='sum') while the SGD learning rate (0.05) was tuned for the mean: the "
     "gradient is 128x larger (the batch size), so every step overshoots and the weights blow up; use "
     "reduction='mean' or divide the LR by the batch size.",
     r"reduction\s*=\s*['\"]?sum|sum(med)? (over|across) the batch|summed loss|sum reduction|"
     r"(scales?|grows?) (linearly )?with (the )?batch size|reduction\s*=\s*['\"]?mean|\d+x larger.{0,40}batch",
     )(energy_sum_reduction_sgd)
fix("energy_sum_reduction_sgd", fixed_of(energy_sum_reduction_sgd),
    rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE", steps=250, higher=False)
