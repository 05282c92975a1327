"""Checks that train on copies or round-trip the real state, each inside
``preserved_training_state``: a checkpoint save and load that restores every tensor, and
the overfit smoke (can the loop memorise one batch?)."""

from __future__ import annotations

import copy
import math
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.checkpoint.files import load_state, write_state
from optimus_preflight.preflight.analyses.sizes import dense_parts
from optimus_preflight.preflight.analyses.trial_steps import make_runner
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

OVERFIT_TARGET = 0.5  # the loss must fall to half its first value


def _tensors_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and a.layout != torch.strided:
        # torch.equal has no sparse kernel: compare the dense tensors that hold each (a COO
        # tensor coalesced first, so the same matrix compares equal however it was built)
        if not isinstance(b, torch.Tensor) or a.layout != b.layout or a.shape != b.shape:
            return False
        if a.layout == torch.sparse_coo:
            a, b = a.detach().coalesce(), b.detach().coalesce()
        return all(_tensors_equal(x, y) for x, y in zip(dense_parts(a), dense_parts(b), strict=True))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a.detach().cpu(), b.detach().cpu())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_tensors_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


class CheckpointRoundTripCheck(Check):
    """Save model + optimizer (+ scheduler, scaler) after a real step, load them back
    with ``weights_only=True`` and load them into the objects."""

    name = "step.checkpoint"
    stage = Stage.STEP
    codes = ("CKPT_LOAD", "CKPT_MISMATCH", "CKPT_RESTORE")
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        fix_objects = ("Keep state_dicts to tensors, numbers, strings, lists and dicts (no lambdas or custom objects), "
                       "so checkpoints load with torch.load(weights_only=True).")
        with preserved_training_state(ctx):
            make_runner(ctx, ctx.model, ctx.optimizer, scheduler=ctx.scheduler).run(iter([(ctx.artifacts.first_batch, True)]))
            payload = {"model": ctx.model.state_dict(), "optimizer": ctx.optimizer.state_dict(),
                       "scaler": ctx.training.scaler.state_dict()}
            if ctx.scheduler is not None:
                payload["scheduler"] = ctx.scheduler.state_dict()
            # The run's own checkpoint format (checkpoint/files.py): DCP tensor files and state.pt.
            with tempfile.TemporaryDirectory(prefix=".preflight-ckpt-", dir=ctx.run_dir) as directory:
                path = Path(directory)
                started = time.perf_counter()
                written = write_state(path, payload)
                saved = time.perf_counter()
                size = sum(entry["bytes"] for entry in written.values())
                try:
                    loaded = load_state(path)
                except Exception as error:
                    findings.error("CKPT_LOAD", f"the checkpoint does not load with weights_only=True: "
                                                f"{str(error).splitlines()[0]}", fix_objects)
                    return
                load_s = time.perf_counter() - saved
            findings.data.update(bytes=size, save_s=round(saved - started, 4), load_s=round(load_s, 4))
            findings.data["summary"] = f"{size / 1024**2:.1f} MiB, save {saved - started:.2f} s, load {load_s:.2f} s"
            if not _tensors_equal(payload, loaded):
                findings.error("CKPT_MISMATCH", "the checkpoint loaded back differs from what was saved", fix_objects)
                return
            try:
                ctx.model.load_state_dict(loaded["model"])
                ctx.optimizer.load_state_dict(loaded["optimizer"])
                if ctx.scheduler is not None:
                    ctx.scheduler.load_state_dict(loaded["scheduler"])
            except Exception as error:
                findings.error("CKPT_RESTORE", f"the saved state does not load back into the objects: "
                                               f"{str(error).splitlines()[0]}",
                               "Make the model's/optimizer's load_state_dict accept their own state_dict.")


def copy_for_training(model: nn.Module, optimizer: Optimizer) -> tuple[nn.Module, Optimizer]:
    """A deep copy of the model and a fresh optimizer of the same class over the copy's
    parameters, with each group's settings at its peak LR and without weight decay.

    Not ``deepcopy(optimizer)``: an LR scheduler patches ``optimizer.step`` with a
    wrapper bound to the original optimizer, which the copy would keep calling.
    """
    memo: dict[int, Any] = {}
    copied = copy.deepcopy(model, memo)
    groups = []
    for group in optimizer.param_groups:
        settings = {key: value for key, value in group.items() if key != "params"}
        settings["lr"] = group.get("initial_lr", group["lr"])  # the peak, not the warmup's first LR
        settings.pop("initial_lr", None)
        if "weight_decay" in settings:
            settings["weight_decay"] = 0.0
        params = [memo[id(p)] for p in group["params"] if id(p) in memo]
        if params:
            groups.append({**settings, "params": params})
    return copied, type(optimizer)(groups)


class OverfitCheck(Check):
    """O1: a correct loop memorises one batch; on copies, at the peak LR, without weight decay."""

    name = "step.overfit"
    stage = Stage.STEP
    codes = ("O1",)
    requires = (FIRST_STEP,)

    @classmethod
    def applies(cls, cfg: Any) -> bool:
        return cfg.preflight.overfit_steps > 0

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        steps = ctx.cfg.preflight.overfit_steps
        batch = ctx.artifacts.first_batch
        with preserved_training_state(ctx):  # the copies still draw from the global RNGs
            model, optimizer = copy_for_training(ctx.model, ctx.optimizer)
            for module in model.modules():
                if isinstance(module, nn.modules.dropout._DropoutNd):
                    module.p = 0.0
            model.train()
            runner = make_runner(ctx, model, optimizer, scaler=copy.deepcopy(ctx.training.scaler), accumulation_steps=1)
            losses = [float(runner.run(iter([(batch, True)])).loss) for _ in range(steps)]
            del model, optimizer
        first, best = losses[0], min(losses)
        findings.data.update(steps=steps, first_loss=first, final_loss=losses[-1], best_loss=best,
                             losses=[round(x, 4) for x in losses])
        findings.data["summary"] = f"loss {first:.3f} -> {losses[-1]:.3f} in {steps} steps on one batch"
        if not (math.isfinite(best) and best <= OVERFIT_TARGET * first):
            findings.error(
                "O1",
                f"on one repeated batch the loss only went from {first:.4f} to {best:.4f} in {steps} steps; a correct "
                "loop memorises a single batch",
                "Look for params not in the optimizer, a detached loss, a wrong zero_grad/step order or a too-low "
                "learning rate; or raise preflight.overfit_steps if the model needs longer.",
                "preflight.overfit_steps",
            )
