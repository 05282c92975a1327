"""Mechanics: schedules, initialisation, BatchNorm statistics, output activations, per-group learning rates."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_ay.registry import (
    SmallCNN,
    TinyResNet,
    arrows,
    case,
    colour_blobs,
    fix,
    fixed_of,
    seed,
    tensor_loaders,
    to_chw,
    val_acc,
    val_nll,
)


def blob_loaders(s, batch_size=32):
    img, y = colour_blobs(1600, s=s)
    x, y = to_chw(img), torch.from_numpy(y)
    return tensor_loaders(x[:1200], y[:1200], x[1200:], y[1200:], batch_size)


def arrow_loaders(s, batch_size=32):
    img, y = arrows(1600, s=s)
    x, y = to_chw(img), torch.from_numpy(y)
    return tensor_loaders(x[:1200], y[:1200], x[1200:], y[1200:], batch_size)


@case("steplr_epochs_stepped_per_batch", "mechanics",
      "StepLR(step_size=10, gamma=0.1) is written for epochs (decay every 10 epochs) but scheduler.step() runs "
      "every batch: the LR is divided by 10 every 10 steps and is ~0 after a few dozen of the 300 steps.",
      r"StepLR|step_size|(stepped|step\(\)|called|runs?) (per|every|each) (batch|iteration|optimi[sz]er step)|"
      r"epochs?.{0,60}(batch|iteration)|(learning rate|\blr\b).{0,60}(decays? (to|towards) (zero|0)|collapses|vanish|"
      r"tiny|near zero|~0)|scheduler.{0,60}too (fast|often|early)")
def steplr_epochs_stepped_per_batch(fixed=False):
    seed(30)
    model = SmallCNN(4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    tr, va = arrow_loaders(31)
    step_size = 10 * len(tr) if fixed else 10  # the fix counts the 10 epochs in optimizer steps
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=step_size, gamma=0.1)
    return dict(model=model, optimizer=optimizer, train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss(),
                scheduler=scheduler, max_steps=300)


fix("steplr_epochs_stepped_per_batch", fixed_of(steplr_epochs_stepped_per_batch), val_nll, "val NLL", higher=False)


def init_weights(fixed):
    def init(m):
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            if fixed:
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            else:
                nn.init.zeros_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return init


@case("zero_init_all_weights", "mechanics",
      "model.apply(init) sets every Conv2d and Linear weight to zero (nn.init.zeros_) instead of Kaiming: all "
      "channels of a layer stay identical (symmetry is never broken) and gradients through the zero weights vanish.",
      r"zeros?_|zero[- ]?(init|initiali[sz]|weight)|(weights?|init\w*).{0,40}(zero|constant)|symmetr|kaiming|"
      r"xavier|identical (channels|units|neurons|filters)|dead (network|gradient)")
def zero_init_all_weights(fixed=False):
    seed(32)
    model = SmallCNN(4)
    model.apply(init_weights(fixed))
    tr, va = blob_loaders(33)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("zero_init_all_weights", fixed_of(zero_init_all_weights), val_acc, "val accuracy")


@case("bn_momentum_zero_from_scratch", "mechanics",
      "To 'freeze BatchNorm' the user sets momentum=0 on every BatchNorm2d of a network trained from scratch: "
      "running_mean / running_var are never updated and stay 0 / 1, so in eval mode the layers normalise with the "
      "wrong statistics while training normalised with batch statistics.",
      r"momentum ?(=|of|is|to) ?0(\.0)?\b|momentum.{0,20}zero|zero momentum|running_(mean|var)|running (stat|"
      r"mean|var)|(stat|statistics).{0,60}(never|not) (be(ing)? )?updated|"
      r"eval(uation)?[- ]mode.{0,60}(statistic|stats)|(statistic|stats).{0,60}eval(uation)?[- ]mode")
def bn_momentum_zero_from_scratch(fixed=False):
    seed(34)
    model = TinyResNet(out=4)
    if not fixed:
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.momentum = 0.0
    tr, va = arrow_loaders(35)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tr, val_loader=va,
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("bn_momentum_zero_from_scratch", fixed_of(bn_momentum_zero_from_scratch), val_acc, "val accuracy")


@case("sigmoid_before_cross_entropy", "mechanics",
      "The classifier ends in nn.Sigmoid() and its (0, 1) outputs go into nn.CrossEntropyLoss, which expects raw "
      "logits: the softmax over squashed scores is nearly uniform and the gradients are tiny, so training crawls.",
      r"sigmoid|squash|\(0, ?1\)|expects? (raw )?logits|logits.{0,40}(bounded|squashed)|"
      r"remove.{0,30}(activation|sigmoid)|saturat")
def sigmoid_before_cross_entropy(fixed=False):
    seed(36)
    model = SmallCNN(4)
    if not fixed:
        model.fc = nn.Sequential(model.fc, nn.Sigmoid())
    tr, va = arrow_loaders(37)
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9), train_loader=tr,
                val_loader=va, loss_fn=nn.CrossEntropyLoss(), max_steps=300)


fix("sigmoid_before_cross_entropy", fixed_of(sigmoid_before_cross_entropy), val_nll, "val NLL (the loss it trains)",
    higher=False)


@case("param_group_learning_rate_key", "mechanics",
      "Discriminative LRs are set with a Keras-style key: {'params': head, 'learning_rate': 1e-2}; torch's "
      "param groups read 'lr', so the unknown key is ignored and the new head trains at the backbone's "
      "default lr=1e-5.",
      r"learning_rate|key.{0,40}\blr\b|\blr\b.{0,40}key|'lr'|\"lr\"|ignored.{0,40}(key|learning)|unknown key|"
      r"(head|new layer).{0,60}(1e-5|default lr|backbone'?s? lr)")
def param_group_learning_rate_key(fixed=False):
    seed(38)
    model = TinyResNet(out=4)
    backbone = [p for n, p in model.named_parameters() if not n.startswith("fc.")]
    head_group = {"params": model.fc.parameters(), ("lr" if fixed else "learning_rate"): 1e-2}
    optimizer = torch.optim.Adam([{"params": backbone}, head_group], lr=1e-5)
    tr, va = blob_loaders(39)
    return dict(model=model, optimizer=optimizer, train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss(),
                max_steps=300)


fix("param_group_learning_rate_key", fixed_of(param_group_learning_rate_key), val_acc, "val accuracy")
