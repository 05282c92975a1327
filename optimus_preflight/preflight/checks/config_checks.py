"""Config-stage checks: settings that are valid one by one but wrong together."""

from __future__ import annotations

import copy
import math
import types
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LambdaLR, MultiplicativeLR

from optimus_preflight.config.lenient import as_float
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

# fp16 vs bf16 autocast, one training step of the default recipe (char_lm: forward,
# backward, AdamW step; GradScaler for fp16) on this project's 2-core x86 CPU machine
# (native bf16), torch 2.13, one compute thread, fastest CPU time of 5 steps each,
# interleaved: fp16 4.50 s, bf16 0.25 s, fp32 0.36 s (the report: 3.7 s vs
# 0.19 s wall with two threads). CPUs have few float16 kernels: autocast converts
# around slow paths where bf16 and fp32 run oneDNN's fast ones.
CPU_FP16_SLOWDOWN = 18
SIMULATE_AT_MOST = 5000  # scheduler.step() calls; LambdaLR is evaluated directly instead
NEAR_ZERO = 0.01  # of the peak LR
STUCK_START = 0.2  # of the run spent under NEAR_ZERO before the LR first rises above it


def schedule_length(scheduler: Any) -> int | None:
    """The number of steps a scheduler is built to span, where it says."""
    for owner in [scheduler, *getattr(scheduler, "lr_lambdas", [])]:
        for attribute in ("total_steps", "T_max"):
            value = getattr(owner, attribute, None)
            if isinstance(value, int) and value > 0:
                return value
    return None


def lr_trajectory(scheduler: Any, optimizer: Any, steps: int) -> list[tuple[int, float]]:
    """(optimizer step, LR of the first group used at that step) over ``steps`` steps.

    LambdaLR is evaluated from its lambdas (exact, any length); other schedulers are
    stepped up to ``SIMULATE_AT_MOST`` times and then put back exactly as they were.
    Raises whatever the scheduler raises (OneCycleLR stepped past its total_steps).
    """
    stride = max(1, steps // 500)
    sample = sorted(set(range(0, steps, stride)) | {steps - 1})
    if isinstance(scheduler, LambdaLR):
        base, lam = scheduler.base_lrs[0], scheduler.lr_lambdas[0]
        return [(step, base * lam(step)) for step in sample]
    saved_scheduler = copy.deepcopy(scheduler.state_dict())
    saved_groups = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    points: list[tuple[int, float]] = []
    wanted = set(sample)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()"
            for step in range(min(steps, SIMULATE_AT_MOST)):
                if step in wanted:
                    points.append((step, optimizer.param_groups[0]["lr"]))
                scheduler.step()
    finally:
        scheduler.load_state_dict(saved_scheduler)
        for group, saved in zip(optimizer.param_groups, saved_groups, strict=True):
            group.update(saved)
    return points


GROWTH = 100.0  # a schedule that rises this many times and peaks at its end is a range test, not a warmup
RAMP_GROWTH = 4.0  # its growth over the second half: a linear warmup doubles, an exponential ramp far more


SHAPE_DROP = 0.5  # a MultiplicativeLR factor that falls this low within the run is a schedule's shape


def compounding_schedule(scheduler: Any, max_steps: int) -> str | None:
    """O8 for MultiplicativeLR given a schedule shape (a cosine or linear decay from 1): it
    multiplies the LR by the lambda's value at EVERY step, so the factors compound."""
    if not isinstance(scheduler, MultiplicativeLR) or max_steps < 4:
        return None
    lam = scheduler.lr_lambdas[0]
    try:
        start, middle, late = (float(lam(step)) for step in (0, max_steps // 2, max_steps - 1))
    except Exception:  # noqa: BLE001 - a lambda that needs more than a step number: judge nothing
        return None
    if not (start >= 0.95 and middle <= 1 - (1 - SHAPE_DROP) / 2 and late <= SHAPE_DROP):
        return None
    product, collapsed = 1.0, None
    for step in range(1, max_steps):
        product *= float(lam(step))
        if product < 0.01 and collapsed is None:
            collapsed = step
    where = f"below 1% of its base by step {collapsed}" if collapsed is not None else f"to {product:.2g}x its base"
    return (f"MultiplicativeLR multiplies the learning rate by its lambda's value at every step, and this lambda is a "
            f"whole schedule ({start:.2g} at step 0, {middle:.2g} at step {max_steps // 2}, {late:.2g} at step "
            f"{max_steps - 1}): the factors compound, their product, not the curve, is the learning rate, and it "
            f"falls {where} of trainer.max_steps={max_steps}")


FLAT_SHARE = 0.5  # of the peak: a run whose learning rate never falls below it trains at its full rate


def schedule_findings(points: list[tuple[int, float]], max_steps: int, length: int | None,
                      base: float | None = None) -> list[tuple[str, str]]:
    """(severity, message) pairs for a schedule that does not fit ``max_steps`` (O8); ``base``
    is the whole schedule's peak where known."""
    found = []
    peak = max((lr for _, lr in points), default=0.0)
    if peak <= 0:
        return [("error", "the learning rate is 0 at every step: the model will not change")]
    # Only after the peak: a warmup may start near 0 on purpose.
    # A recursive schedule (CosineAnnealingLR) comes back to its peak with rounding above it:
    # the first step at the peak is where the decay starts.
    peak_step = next(step for step, lr in points if lr >= peak * (1 - 1e-6))
    dead = next((step for step, lr in points if step > peak_step and lr < NEAR_ZERO * peak), None)
    if dead is not None and dead < 0.9 * max_steps:
        zero = next((step for step, lr in points if step > peak_step and lr == 0), None)
        reaches = (f"reaches 0 at step {zero}" if zero is not None and zero <= dead + max(1, max_steps // 100)
                   else f"falls below 1% of its peak at step {dead}")
        back = next((step for step, lr in points if step > dead and lr >= 0.5 * peak), None)
        if back is not None:
            low = sum(1 for _, lr in points if lr < 0.1 * peak) / len(points)
            found.append(("warning", f"the learning rate {reaches} of trainer.max_steps={max_steps} and then climbs "
                                     f"back (half its peak again at step {back}), over and over: it cycles between "
                                     f"its peak and ~0 through the run and spends {low:.0%} of it below a tenth of "
                                     "its peak, where the model barely trains. A cosine schedule stepped per batch "
                                     "with epoch settings cycles like this"))
        else:
            found.append(("warning", f"the learning rate {reaches} of trainer.max_steps={max_steps}: the remaining "
                                     f"{100 * (1 - dead / max_steps):.0f}% of the run barely trains. A schedule sized "
                                     "for one epoch (num_training_steps=len(train_loader)) or stepped per batch with "
                                     "epoch settings ends this early"))
    # Before the peak: a warmup rises smoothly, so it is under 1% of the peak for about 1% of
    # its length; a long stretch there is a factor stuck at 0 (integer division, a step-wise ramp).
    stuck = next((step for step, lr in points if lr >= NEAR_ZERO * peak), 0)
    if stuck >= STUCK_START * max_steps:
        found.append(("warning ramp", f"the learning rate stays below 1% of its peak for the first {stuck} of trainer."
                                 f"max_steps={max_steps} steps ({100 * stuck / max_steps:.0f}% of the run) and then "
                                 f"jumps to {points[next(i for i, (st, _) in enumerate(points) if st == stuck)][1]:.3g}: "
                                 "nothing trains until then. A warmup factor computed with integer division (step // "
                                 "warmup_steps, min(1, step // warmup_steps)) is 0 for the whole warmup and then 1, "
                                 "not a ramp"))
    first = points[0][1] if points else 0.0
    # A range test's ramp grows by a factor per step; an unfinished linear warmup only doubles
    # from half-way to the end (the warning that the run is all warmup covers that one).
    halfway = next((lr for step, lr in points if step >= peak_step / 2), peak)
    if first > 0 and peak >= GROWTH * first and peak_step >= 0.9 * points[-1][0] and peak >= RAMP_GROWTH * halfway:
        found.append(("error", f"the learning rate grows {peak / first:.3g}x over the run and peaks at its end "
                               f"({peak:.3g} at step {peak_step}): a schedule that only rises, such as an LR range "
                               "test's exponential ramp left as the training scheduler, drives any optimizer to "
                               "diverge"))
    if length is not None and length < 0.9 * max_steps and dead is None:
        found.append(("warning", f"the LR schedule spans {length} steps but trainer.max_steps={max_steps}: it ends "
                                 "(or restarts) early"))
    if length is not None and length > 1.25 * max_steps:
        low = min(lr for step, lr in points if step >= peak_step)  # a warmup's start is no decay
        if low >= FLAT_SHARE * peak and (base is None or peak >= 0.9 * base):
            # a cosine or step decay cut short: the run trains at its full rate throughout, as with
            # a constant LR, only without the annealing at the end
            found.append(("info", f"the LR schedule spans {length} steps but training stops at trainer.max_steps="
                                  f"{max_steps}, {100 * max_steps / length:.0f}% of the way through: the learning rate "
                                  f"stays within {100 * (1 - low / peak):.0f}% of its peak and the decay never happens "
                                  "(fine for a trial run; the real run should end where the schedule does)"))
            return found
        found.append(("warning", f"the LR schedule spans {length} steps but training stops at trainer.max_steps="
                                 f"{max_steps}, {100 * max_steps / length:.0f}% of the way through: the decay never "
                                 "happens. A schedule counted in micro-batches is trainer.accumulation_steps times "
                                 "too long"))
    return found


LAMBDA_STEPS = (0, 1, 10, 100, 1000)  # and trainer.max_steps: where late-bound lambdas are compared


DATA_TYPES = (int, float, complex, str, tuple, list, dict)


def _outer_variables(fn: types.FunctionType) -> dict[str, Any]:
    """The variables a lambda reads from outside itself that a loop can rebind, with their
    values now: closure cells (a comprehension's or a function's loop variable) and
    module-level data (a for loop at the top of a script); helper functions left out."""
    found: dict[str, Any] = {}
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if not callable(value) and not isinstance(value, types.ModuleType):
            found[name] = value
    for name in fn.__code__.co_names:
        value = fn.__globals__.get(name)
        if isinstance(value, DATA_TYPES):
            found[name] = value
    return found


def _shared_binding(first: types.FunctionType, other: types.FunctionType) -> bool:
    """One code object reading the very same cells, with the same defaults: the lambdas of
    one loop scope, which cannot differ. A factory called once per group makes new cells
    each call and binds its values properly, even equal ones."""
    if first.__code__ is not other.__code__ or first.__defaults__ != other.__defaults__:
        return False
    if first.__kwdefaults__ != other.__kwdefaults__:
        return False
    cells, others = first.__closure__ or (), other.__closure__ or ()
    return len(cells) == len(others) and all(cell is cell2 for cell, cell2 in zip(cells, others, strict=True))


def late_bound_lambdas(scheduler: Any, max_steps: int) -> dict[str, Any] | None:
    """What two or more distinct lambda objects of a LambdaLR/MultiplicativeLR share when
    they were made in a loop that binds its variable late (``[lambda s: f(s, k) for k in
    ks]``: every lambda reads the last k) and so give every group the same factors; None
    otherwise. One function given for every group (``LambdaLR(opt, fn)``, stored as the same
    object repeated) is not several lambdas."""
    if not isinstance(scheduler, (LambdaLR, MultiplicativeLR)):
        return None
    lambdas = list(getattr(scheduler, "lr_lambdas", []))
    distinct = list({id(fn): fn for fn in lambdas}.values())
    if len(distinct) < 2 or not all(isinstance(fn, types.FunctionType) for fn in distinct):
        return None
    first = distinct[0]
    variables = _outer_variables(first)
    if not variables or not all(_shared_binding(first, fn) for fn in distinct[1:]):
        return None
    steps = sorted({*LAMBDA_STEPS, max(0, int(max_steps))})
    try:
        values = [[float(fn(step)) for step in steps] for fn in distinct]
    except Exception:
        return None
    if any(row != values[0] for row in values[1:]):
        return None
    return {"lambdas": len(distinct), "groups": len(lambdas), "variables": variables,
            "factors": dict(zip(steps, values[0], strict=True))}


class LrScheduleCheck(Check):
    """O8: the schedule's length in optimizer steps vs the planned optimizer steps;
    per-group lambdas that all read one late-bound loop variable."""

    name = "config.lr_schedule"
    stage = Stage.CONFIG
    codes = ("O8", "LR_LAMBDA_LATE_BINDING", "LR_LAMBDA_RETURNS_LR", "SCHEDULER_OTHER_OPTIMIZER")

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        scheduler = ctx.scheduler
        max_steps = ctx.cfg.trainer.max_steps
        names = {param: name for name, param in ctx.model.named_parameters()}
        if scheduler is None:
            findings.data["summary"] = "no scheduler: constant LR"
            self._constant_lr(ctx.optimizer, findings, names)
            return
        if self._other_optimizer(scheduler, ctx.optimizer, findings):
            return
        self._scheduled_zero_lr(scheduler, ctx.optimizer, findings, names)
        self._late_binding(scheduler, max_steps, findings)
        length = schedule_length(scheduler)
        fix = ("Size the schedule in optimizer steps: leave scheduler.total_steps=null to follow trainer.max_steps, "
               "or set it to trainer.max_steps (not the number of batches).")
        try:
            points = lr_trajectory(scheduler, ctx.optimizer, max_steps)
        except Exception as error:  # e.g. OneCycleLR: "Tried to step X times..."
            findings.error("O8", f"the LR scheduler fails before trainer.max_steps={max_steps}: {error}", fix,
                           "scheduler")
            return
        findings.data.update(
            scheduler=type(scheduler).__name__,
            length=length,
            max_steps=max_steps,
            lr_first=points[0][1] if points else None,
            lr_peak=max(lr for _, lr in points) if points else None,
            lr_last=points[-1][1] if points else None,
            simulated_steps=points[-1][0] + 1 if points else 0,
        )
        findings.data["summary"] = (
            f"{type(scheduler).__name__}: LR {points[0][1]:.2e} -> peak {findings.data['lr_peak']:.2e} -> "
            f"{points[-1][1]:.2e} at step {points[-1][0] + 1}"
        )
        if (compounding := compounding_schedule(scheduler, max_steps)) is not None:
            findings.error("O8", compounding,
                           "Give a schedule shape to LambdaLR (lr = base_lr * lr_lambda(step)); MultiplicativeLR is for "
                           "a constant per-step factor (lambda step: 0.95).", "scheduler")
            return
        negative = next(((step, lr) for step, lr in points if lr < 0), None)
        if negative is not None:
            lowest = min(lr for _, lr in points)
            findings.error(
                "O8",
                f"the learning rate becomes negative at step {negative[0]} ({negative[1]:.3g}, down to {lowest:.3g} by "
                f"trainer.max_steps={max_steps}): with a negative learning rate every optimizer climbs the loss. A "
                "LambdaLR factor such as 1 - step / decay_steps, not clamped at 0, does this once the run outlasts "
                "decay_steps (a length counted in epochs of batches, a run made longer)",
                "Clamp the factor and size it by the run: lr_lambda=lambda step: max(0.0, 1 - step / total_steps), with "
                "total_steps = trainer.max_steps (the optimizer steps the run takes).",
                "scheduler",
            )
            return
        base = base_lr(scheduler, ctx.optimizer)
        for severity, message in schedule_findings(points, max_steps, length, schedule_peak(scheduler, ctx.optimizer, base)):
            stepped = epoch_settings(scheduler) if "barely trains" in message else None
            if stepped is not None:
                findings.add(severity, "O8", f"{message}. {stepped[0]}", stepped[1], "scheduler")
                continue
            if severity == "warning ramp":
                findings.warning("O8", message, "Ramp the factor with a float ratio: lr_lambda=lambda step: min(1.0, "
                                 "(step + 1) / warmup_steps) (or transformers' get_linear_schedule_with_warmup).",
                                 "scheduler.warmup_steps")
                continue
            findings.add(severity, "O8", message, fix, "scheduler.total_steps")
        if (above := above_base(scheduler, points, base)) is not None:
            findings.error("O8", *above, "scheduler")
        if (absolute := lambda_returns_lr(scheduler, points, base)) is not None:
            findings.error("LR_LAMBDA_RETURNS_LR", absolute,
                           "Return only the multiplicative factor from lr_lambda (lambda step: 0.98 ** (step / 10), "
                           "not lambda step: 3e-3 * 0.98 ** (step / 10)); the optimizer's lr is the base it scales.",
                           "scheduler")
        elif not absolute_lambda(scheduler, base) and (unreached := peak_not_reached(points, base, max_steps)) is not None:
            findings.warning("O8", unreached,
                             "Shorten the warmup: scheduler.warmup_fraction=0.05 (5% of the run), or a "
                             "scheduler.warmup_steps well below trainer.max_steps.", "scheduler.warmup_steps")


    @staticmethod
    def _other_optimizer(scheduler: Any, optimizer: Any, findings: Findings) -> bool:
        """SCHEDULER_OTHER_OPTIMIZER: the scheduler was built on another optimizer object than the
        one that trains (a wrapper sharing its param_groups counts as the same)."""
        scheduled = getattr(scheduler, "optimizer", None)
        if scheduled is None or scheduled is optimizer or getattr(optimizer, "optimizer", None) is scheduled \
                or getattr(scheduled, "param_groups", None) is getattr(optimizer, "param_groups", None):
            return False
        findings.error(
            "SCHEDULER_OTHER_OPTIMIZER",
            f"the {type(scheduler).__name__} was built on another {type(scheduled).__name__} object than the optimizer "
            f"that trains ({type(optimizer).__name__}): scheduler.step() changes the learning rate of an optimizer "
            "nothing steps, and the one that trains keeps its initial lr for the whole run (no warmup, no decay). An "
            "optimizer rebuilt after the scheduler was made (after freezing or unfreezing layers, after moving the "
            "model, a second optimizer for a new phase) does this",
            "Build the scheduler from the optimizer you train with, after that optimizer is final: scheduler = "
            "Scheduler(optimizer, ...); rebuild the scheduler whenever you rebuild the optimizer.",
            "scheduler",
        )
        return True

    @staticmethod
    def _late_binding(scheduler: Any, max_steps: int, findings: Findings) -> None:
        """Per-group lambdas made in a loop without binding its variable: one schedule for all."""
        found = late_bound_lambdas(scheduler, max_steps)
        if found is None:
            return
        kind = type(scheduler).__name__
        names = list(found["variables"])
        values = ", ".join(f"{name}={value!r}" for name, value in found["variables"].items())
        factors = ", ".join(f"{value:.3g} at step {step}" for step, value in list(found["factors"].items())[:4])
        groups = "both" if found["groups"] == 2 else f"all {found['groups']}"
        findings.data["late_bound_lambdas"] = found["lambdas"]
        findings.error(
            "LR_LAMBDA_LATE_BINDING",
            f"the {kind}'s {found['lambdas']} lr_lambdas are one lambda made in a loop, all reading "
            f"{', '.join(names)} from the scope they were made in: a lambda reads the variable when it is called, "
            f"not when it is made, so every lambda sees the loop's last value ({values}) and {groups} parameter "
            f"groups get the same factors ({factors}) instead of one schedule each",
            "Bind the value when each lambda is made, as a default argument: [lambda step, "
            + ", ".join(f"{name}={name}" for name in names) + ": ... for ...], or functools.partial(fn, "
            + ", ".join(f"{name}={name}" for name in names) + "). If one schedule for every group is meant, pass "
            f"that one function: {kind}(optimizer, fn).",
        )

    @staticmethod
    def _constant_lr(optimizer: Any, findings: Findings, names: dict[Any, str]) -> None:
        """Without a scheduler the optimizer's own lr is every step's: 0 in every group
        that holds trainable parameters trains nothing."""
        groups = [group for group in getattr(optimizer, "param_groups", [])
                  if any(getattr(p, "requires_grad", False) for p in group.get("params", []))]
        rates = [as_float(group.get("lr")) for group in groups]
        if not groups or any(rate is None for rate in rates):
            return
        zero = [index for index, rate in enumerate(rates) if rate == 0]
        findings.data["lr_groups"] = rates
        if len(zero) == len(groups):
            findings.error(
                "O8",
                f"the optimizer's learning rate is 0 in {'its only parameter group' if len(groups) == 1 else 'every parameter group'} "
                "and no scheduler changes it: no step will change the model",
                "Pass the learning rate you mean to the optimizer (e.g. torch.optim.AdamW(params, lr=3e-4)), or check "
                "the value it is computed from (a config key read as 0, a base LR multiplied by a 0 scale factor).",
                "optimizer.lr",
            )
        elif zero:
            _frozen_by_lr(findings, [groups[index] for index in zero], zero, names, "and no scheduler")

    @staticmethod
    def _scheduled_zero_lr(scheduler: Any, optimizer: Any, findings: Findings, names: dict[Any, str]) -> None:
        """A scheduler multiplies each group's base lr: a group whose base is 0 stays at 0
        while the others train (LambdaLR, cosine, warmup alike)."""
        groups = list(getattr(optimizer, "param_groups", []))
        bases = list(getattr(scheduler, "base_lrs", None) or [group.get("initial_lr") for group in groups])
        rates = [as_float(base) for base in bases]
        if len(rates) != len(groups) or any(rate is None for rate in rates):
            return
        trainable = [index for index, group in enumerate(groups)
                     if any(getattr(p, "requires_grad", False) for p in group.get("params", []))]
        zero = [index for index in trainable if rates[index] == 0]
        if zero and len(zero) < len(trainable):
            _frozen_by_lr(findings, [groups[index] for index in zero], zero, names,
                          "as the base the scheduler scales, so it stays 0")


def _frozen_by_lr(findings: Findings, groups: list[dict], indices: list[int], names: dict[Any, str], why: str) -> None:
    """Some groups at lr 0 while others train: a group that inherited the optimizer's default
    lr=0 (a new head in a fine-tune) is the common cause; freezing is requires_grad's job."""
    params = [names.get(p, "?") for group in groups for p in group.get("params", []) if getattr(p, "requires_grad", False)]
    shown = ", ".join(params[:4]) + (f" and {len(params) - 4} more" if len(params) > 4 else "")
    findings.warning(
        "O8",
        f"parameter group(s) {', '.join(str(i) for i in indices)} have lr=0 {why}: their {len(params)} trainable "
        f"tensor(s) ({shown}) get gradients but never change, while the other groups train",
        "Give the group its learning rate (a group without 'lr' inherits the optimizer's default lr, here 0); "
        "to freeze those parameters on purpose, set requires_grad_(False) on them instead.",
        "optimizer.lr",
    )


def base_lr(scheduler: Any, optimizer: Any) -> float | None:
    """The LR the schedule scales (optimizer.lr as configured), where it is known."""
    bases = getattr(scheduler, "base_lrs", None)
    if bases:
        return float(bases[0])
    initial = optimizer.param_groups[0].get("initial_lr") if optimizer.param_groups else None
    return float(initial) if initial is not None else None


ABOVE_BASE = 10.0  # x the configured LR: a schedule's own peak, not a decay or a warmup to it
OWN_PEAK = ("OneCycleLR", "CyclicLR")  # these take their peak as an argument, above the optimizer's lr by design


def schedule_peak(scheduler: Any, optimizer: Any, base: float | None) -> float | None:
    """The highest LR the whole schedule reaches: its own ``max_lr`` for the schedules that
    take one, the configured LR for the others."""
    if type(scheduler).__name__ == "OneCycleLR" and optimizer.param_groups:
        peak = optimizer.param_groups[0].get("max_lr")
        return float(peak) if peak is not None else base
    if type(scheduler).__name__ == "CyclicLR" and getattr(scheduler, "max_lrs", None):
        return float(scheduler.max_lrs[0])
    return base


def above_base(scheduler: Any, points: list[tuple[int, float]], base: float | None) -> tuple[str, str] | None:
    """(message, fix) when the schedule takes the LR to ten times the configured one or more."""
    if base is None or base <= 0 or not points or type(scheduler).__name__ in OWN_PEAK:
        return None
    peak_step, peak = max(points, key=lambda point: point[1])
    if peak < ABOVE_BASE * base:
        return None
    eta_min = getattr(scheduler, "eta_min", None)
    if isinstance(eta_min, (int, float)) and eta_min >= ABOVE_BASE * base:
        return (f"{type(scheduler).__name__}(eta_min={eta_min:g}) anneals towards eta_min, an absolute learning "
                f"rate, and it is {eta_min / base:.3g}x the optimizer's lr={base:g}: the 'annealing' raises the LR "
                f"along a cosine to {peak:.3g} (step {peak_step}). A minimum given as a ratio of the base LR (timm's "
                "and Hugging Face's min_lr_ratio) is not eta_min",
                f"Pass the absolute minimum: eta_min = ratio * lr (e.g. {eta_min:g} * {base:g} = {eta_min * base:.3g}).")
    rates = [lr for _, lr in points]
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR) and peak_step == points[-1][0] \
            and all(later >= earlier for earlier, later in zip(rates, rates[1:], strict=False)):
        return (f"the LambdaLR factor never stops rising: it is still climbing at the last step, {peak_step}, where it "
                f"takes the learning rate to {peak:.3g}, {peak / base:.3g}x the optimizer's lr={base:g}. A warm-up "
                "lambda without a cap, (step + 1) / warmup_steps, keeps multiplying the LR past the warm-up instead "
                "of holding it at 1 (then decaying)",
                "Cap the warm-up factor at 1: lr_lambda=lambda step: min(1.0, (step + 1) / warmup_steps), or "
                "transformers' get_linear_schedule_with_warmup / get_cosine_schedule_with_warmup for warm-up then "
                "decay.")
    return (f"the {type(scheduler).__name__} schedule takes the learning rate to {peak:.3g} at step {peak_step}, "
            f"{peak / base:.3g}x the optimizer's lr={base:g}: a factor or bound given in the wrong units (an absolute "
            "LR where a ratio was meant, or the reverse) makes the schedule leave the range the lr was tuned for",
            "Check the scheduler's arguments against the optimizer's lr: factors (LambdaLR) multiply it, bounds "
            "(eta_min, min_lr, max_lr) are absolute learning rates.")


def epoch_settings(scheduler: Any) -> tuple[str, str] | None:
    """(cause, fix) naming the per-epoch setting of a scheduler that decays by a factor per
    ``step()``, for a schedule found to die early: stepped once per batch, it counts batches."""
    name = type(scheduler).__name__
    gamma = getattr(scheduler, "gamma", None)
    if isinstance(scheduler, torch.optim.lr_scheduler.ExponentialLR) and gamma and 0 < gamma < 1:
        to_one_percent = math.log(NEAR_ZERO) / math.log(gamma)
        return (f"ExponentialLR(gamma={gamma:g}) multiplies the LR by {gamma:g} at every scheduler.step(); stepped "
                f"after every batch it is under 1% after {to_one_percent:.0f} steps: a gamma meant per epoch, stepped "
                "per batch (or per optimizer step)",
                f"Step the scheduler once per epoch, or make gamma per step: gamma = {gamma:g} ** (1 / "
                "len(train_loader)).")
    if isinstance(scheduler, (torch.optim.lr_scheduler.StepLR, torch.optim.lr_scheduler.MultiStepLR)) and gamma:
        setting = (f"step_size={scheduler.step_size}" if isinstance(scheduler, torch.optim.lr_scheduler.StepLR)
                   else f"milestones={sorted(scheduler.milestones)}")
        return (f"{name}({setting}, gamma={gamma:g}) counts scheduler.step() calls; stepped after every batch, "
                f"{setting} counts batches, not the epochs it was meant as",
                f"Step the scheduler once per epoch, or give {setting.split('=')[0]} in optimizer steps "
                "(epochs * len(train_loader)).")
    if isinstance(scheduler, torch.optim.lr_scheduler.CosineAnnealingLR):
        return (f"CosineAnnealingLR(T_max={scheduler.T_max}) reaches its minimum after T_max scheduler.step() calls; "
                "stepped after every batch, T_max counts batches, not the epochs it was meant as",
                "Set T_max to the number of optimizer steps (trainer.max_steps), or step the scheduler once per epoch.")
    return None


def absolute_lambda(scheduler: Any, base: float | None) -> bool:
    """A LambdaLR over a base LR of about 1: the deliberate form of a lambda that returns the
    learning rate itself (Noam's d_model ** -0.5 * min(...)), whose own curve, not the base, is
    the schedule."""
    return isinstance(scheduler, LambdaLR) and base is not None and 0.5 <= base <= 2.0


def peak_not_reached(points: list[tuple[int, float]], base: float | None, max_steps: int) -> str | None:
    """A warmup longer than the run: the LR never comes near the configured one."""
    if base is None or base <= 0 or not points:
        return None
    peak = max(lr for _, lr in points)
    if peak >= 0.9 * base:
        return None
    rising = len(points) >= 2 and points[-1][1] >= peak and points[-1][1] > points[0][1]
    # a warmup still rising at the last step, read as linear from its start, ends this far out
    end = (f"; still rising at the last step, a linear warmup at that pace reaches the target only after about "
           f"{round(max_steps * base / peak, -2):.0f} steps" if rising and peak > 0 else "")
    return (f"the learning rate never reaches its configured value {base:.2e} within trainer.max_steps={max_steps}: "
            f"it peaks at {peak:.2e} ({100 * peak / base:.0f}%), so the run is all warmup: the warmup is longer than "
            f"the run{end}")


def lambda_returns_lr(scheduler: Any, points: list[tuple[int, float]], base: float | None) -> str | None:
    """A LambdaLR whose lambda returns the learning rate itself, not a factor: the LR peaks
    at the base LR squared. A base of about 1 with an absolute schedule is the deliberate form."""
    if not isinstance(scheduler, LambdaLR) or base is None or not 0 < base < 0.5 or not points:
        return None
    peak = max(lr for _, lr in points)
    if abs(peak - base * base) > 0.05 * base * base:
        return None
    return (f"LambdaLR multiplies the optimizer's lr={base:g} by what lr_lambda returns, and this lambda returns "
            f"the learning rate itself (its peak is {peak / base:.3g}, the lr): the scheduled LR peaks at "
            f"{base:g} * {base:g} = {peak:.3g}, {1 / base:.0f}x too small, and the model barely trains")


def cpu_fp16_finding(precision: str, device_type: str) -> tuple[str, str] | None:
    """(message, fix) when fp16 autocast would run on a CPU."""
    if precision != "fp16" or device_type != "cpu":
        return None
    return (
        "trainer.precision=fp16 autocasts to float16 on the CPU, which has few fast float16 kernels: "
        f"measured ~{CPU_FP16_SLOWDOWN}x slower than bf16 on a CPU (the default recipe's training step)",
        "Set trainer.precision=bf16 (mixed precision that CPUs run fast), or trainer.precision=fp32.",
    )


class PrecisionCheck(Check):
    """fp16 autocast is a GPU setting: on a CPU it is far slower than bf16 or fp32."""

    name = "config.precision"
    stage = Stage.CONFIG
    codes = ("PRECISION_CPU_FP16",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        precision, device = ctx.training.plan.precision, ctx.device.type
        findings.data.update(precision=precision, device=device)
        findings.data["summary"] = f"{precision} on {device}"
        found = cpu_fp16_finding(precision, device)
        if found is not None:
            findings.warning("PRECISION_CPU_FP16", *found, "trainer.precision")
