"""Small builders for StepRunner tests."""

from __future__ import annotations

import torch
from torch import nn

from optimus_preflight.config.schema import GradScalerConfig
from optimus_preflight.training.precision import PrecisionPlan, make_grad_scaler
from optimus_preflight.training.step import StepRunner

CPU = torch.device("cpu")


class GradRecorder(torch.optim.SGD):
    """SGD that keeps a copy of the gradients (and LRs) it was asked to apply."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, lr=lr)
        self.seen_grads: list[list[torch.Tensor]] = []
        self.seen_lrs: list[list[float]] = []

    def step(self, closure=None):
        self.seen_grads.append([p.grad.clone() for g in self.param_groups for p in g["params"] if p.grad is not None])
        self.seen_lrs.append([g["lr"] for g in self.param_groups])
        return super().step(closure)


def make_runner(model: nn.Module, compute_loss, *, accumulation_steps=1, precision="fp32", optimizer=None, scheduler=None, clip=None, skip_nonfinite=True, init_scale=1024.0):
    plan = PrecisionPlan(precision, CPU)
    optimizer = optimizer or GradRecorder(model.parameters())
    runner = StepRunner(
        model,
        optimizer,
        scheduler,
        # A small initial scale: the default 65536 overflows fp16 on these toy losses.
        make_grad_scaler(plan, GradScalerConfig(init_scale=init_scale)),
        plan,
        compute_loss,
        clip_grad_norm=clip,
        skip_nonfinite=skip_nonfinite,
        accumulation_steps=accumulation_steps,
    )
    return runner, optimizer


def window(batches):
    """A window as BatchStream yields it: (batch, is_last)."""
    return ((batch, index == len(batches) - 1) for index, batch in enumerate(batches))


def mean_squared_error(model, batch):
    inputs, targets = batch
    return ((model(inputs) - targets) ** 2).mean()
