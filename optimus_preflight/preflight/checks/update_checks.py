"""What the first optimizer step did to the weights (``analyses/update_audit.py``): an
update that is no update, climbs the loss, or is swamped by weight decay, eps or clipping."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from optimus_preflight.config.lenient import as_float
from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.analyses.update_audit import update_findings
from optimus_preflight.preflight.checks.config_checks import lr_trajectory
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

KEYS = {"UPDATE_WEIGHT_DECAY": "optimizer.weight_decay", "UPDATE_EPS": "optimizer.eps",
        "UPDATE_BETAS": "optimizer.betas", "UPDATE_TOO_LARGE": "optimizer.lr",
        "UPDATE_CLIPPED": "trainer.clip_grad_norm", "UPDATE_TOO_SMALL": "optimizer.lr"}


class UpdateCheck(Check):
    """The first step's update per parameter group, against its gradient and its weights."""

    name = "step.update"
    stage = Stage.STEP
    codes = ("UPDATE_NONE", "UPDATE_ASCENT", "UPDATE_UNDONE", "UPDATE_WEIGHT_DECAY", "UPDATE_EPS", "UPDATE_CLIPPED",
             "UPDATE_BETAS", "UPDATE_TOO_LARGE", "UPDATE_TOO_SMALL", "UPDATE_ROUNDED",
             "UPDATE_NOT_GRADIENT", "INIT_SYMMETRIC", "GRAD_CUT_IN_STEP_HOOK")
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        probe = get_probe(ctx)
        if not probe.completed or not probe.stepped:  # an error, or the GradScaler skipped it: nothing to audit
            findings.data["summary"] = "no optimizer step to audit"
            return
        findings.data["groups"] = [
            {"group": step.index, "lr": step.lr, "tensors": len(step.names), "values": step.values,
             "update_rms": float(step.delta.pow(2).mean().sqrt()), "weight_rms": float(step.before.pow(2).mean().sqrt()),
             "grad_rms": float(step.grad.pow(2).mean().sqrt())}
            for step in probe.updates
        ]
        findings.data["summary"] = "; ".join(
            f"group {g['group']}: update rms {g['update_rms']:.2g} on weights rms {g['weight_rms']:.2g}"
            for g in findings.data["groups"][:4]) or "no parameter group with gradients"
        if probe.symmetric_weights:
            shown = ", ".join(probe.symmetric_weights[:4]) + (" ..." if len(probe.symmetric_weights) > 4 else "")
            params = dict(ctx.model.named_parameters())
            zeros = [name for name in probe.symmetric_weights if name in params and not bool(params[name].detach().any())]
            how = ("they are initialised to zero (nn.init.zeros_): every unit of a layer computes the same value (0, "
                   "with a zero gradient behind a ReLU) and gets the same update, so each such layer computes a single "
                   "feature however wide it is, and the model predicts little more than the class prior"
                   if len(zeros) == len(probe.symmetric_weights) else
                   "a constant initialisation (nn.init.constant_, ones_, fill_) keeps the units identical forever, so "
                   "each such layer computes a single feature however wide it is")
            findings.error(
                "INIT_SYMMETRIC",
                f"{len(probe.symmetric_weights)} weight(s) start with every unit identical and get identical gradients "
                f"({shown}): {how}",
                "Initialise weights randomly (the layers' defaults, or nn.init.kaiming_uniform_ / xavier_uniform_ / "
                "normal_(std=0.02)); constants are for biases and normalisation gains only.",
            )
        max_steps = ctx.cfg.trainer.max_steps
        for found in update_findings(probe.updates, optimizer_name=type(ctx.optimizer).__name__,
                                     grad_norm=probe.grad_norm, clip_grad_norm=ctx.cfg.trainer.clip_grad_norm,
                                     run_lr_multiple=run_lr_multiple(ctx.scheduler, ctx.optimizer, max_steps),
                                     max_steps=max_steps,
                                     peak_lr_multiple=peak_lr_multiple(ctx.scheduler, ctx.optimizer, max_steps),
                                     built_lr=as_float(getattr(ctx.optimizer, "defaults", {}).get("lr"))):
            findings.add(found.severity, found.code, found.message, found.fix, KEYS.get(found.code),
                         code_fix=found.code_fix)


def _trajectory(scheduler: Any, optimizer: Any, max_steps: Any) -> list[tuple[int, float]] | None:
    """The schedule's (step, lr) points over ``max_steps``, starting above 0; None when it
    cannot be read (O8 reports a schedule that fails)."""
    if not isinstance(max_steps, int) or max_steps <= 0:
        return None
    try:
        points = lr_trajectory(scheduler, optimizer, max_steps)
    except Exception:
        return None
    return points if points and points[0][1] > 0 else None


def peak_lr_multiple(scheduler: Any, optimizer: Any, max_steps: Any) -> float | None:
    """The schedule's highest learning rate over its first step's (1 without a scheduler); None
    when the schedule cannot be read."""
    if scheduler is None:
        return 1.0
    points = _trajectory(scheduler, optimizer, max_steps)
    return max(lr for _, lr in points) / points[0][1] if points else None


def run_lr_multiple(scheduler: Any, optimizer: Any, max_steps: Any) -> float | None:
    """The learning rates of all ``max_steps`` optimizer steps summed, in units of the first
    step's (``max_steps`` for a constant lr); None when the schedule cannot be read."""
    if scheduler is None:
        return float(max_steps) if isinstance(max_steps, int) and max_steps > 0 else None
    points = _trajectory(scheduler, optimizer, max_steps)
    if points is None:
        return None
    total, previous_step, previous_lr = 0.0, None, None
    for step, lr in points:
        if previous_step is not None:
            total += previous_lr * (step - previous_step)
        previous_step, previous_lr = step, lr
    total += previous_lr * (max_steps - previous_step)  # the simulated part ends early: its last lr persists
    return total / points[0][1]
