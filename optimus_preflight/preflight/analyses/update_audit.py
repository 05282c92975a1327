"""What the first real optimizer step did to the weights, per parameter group.

The probe's step (``probe.py``) hands the optimizer the final gradients (unscaled,
weighted, clipped) and then calls ``step()``. An ``UpdateRecorder`` reads a fixed sample
of every group's weights and gradients just before that call and the same weights just
after it, so the update ``delta = after - before`` can be set against what produced it:

- no weight moved although gradients arrived and the learning rate is not 0: ``step()``
  threw the gradients away (a ``zero_grad()`` at its start, an early return);
- the weights moved *up* the gradient: ``maximize=True``, or a step that adds the gradient;
- the update is mostly a shrink of the weights towards 0 and a large one: the weight decay
  swamps the gradient (``weight_decay=5`` for ``5e-4``);
- an Adam-family ``eps`` far above the gradients: ``g / (sqrt(v) + eps)`` is ``g / eps``,
  a tiny step whatever the learning rate; ``betas`` given in the wrong order;
- clipping to a threshold that divides every update by thousands;
- an update as large as the weights themselves (the learning rate);
- for SGD, Adam and AdamW from empty state, whose first update is a closed formula: weights
  that moved far less than that formula (a step hook writing an EMA into the live weights);
- weights whose units are all identical and get identical gradients (a constant init).

Every first step of SGD (any momentum), Adam, AdamW, RMSprop, Adagrad, Adamax, NAdam,
RAdam, Lion or a sign-based step moves each weight against the sign of its gradient: the
direction finding is about the mechanism, not a list of optimizers. Magnitudes alone are
not judged: a small learning rate with small gradients is legitimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from optimus_preflight.config.lenient import as_float
from optimus_preflight.preflight.analyses.loss_findings import Finding

SAMPLE_PER_PARAM = 4096  # values read per tensor: enough for cosines and medians, cheap for 10B models
ASCENT_COSINE = -0.3  # cos(update, -gradient) below this: the step climbs the loss
DECAY_SHRINK = 0.01  # weights lose this share of their size per step to the decay: 100x common settings
DECAY_ERROR_SHRINK = 0.1
DECAY_COSINE = 0.5  # cos(update, -weights) above this: the update is mostly the shrink
EPS_OVER_GRAD = 10.0  # eps this many times the median |gradient|: the update is ~lr * g / eps
EPS_USUAL_MAX = 1e-4  # below this, eps is a usual setting (1e-8 .. 1e-5) whatever the gradients
# The update's rms over the weights' rms: 0.0007 to 0.05 across the 51 healthy setups of the
# held-out sets a-d (SGD, Adam/AdamW, fine-tunes, tiny GPT-2/BERT/T5/Llama); 1 means the first
# step alone is as large as the initialisation.
UPDATE_OVER_WEIGHTS = 1.0
MIN_WEIGHT_RMS = 1e-3  # a group initialised at (near) zero has no size to compare with
SGD_GRADIENT_GROWTH = 10.0
RUN_MOVEMENT = 0.005  # the most the whole run could move the weights, as a share of their rms
CLIP_FACTOR = 1e-3  # clipping scales the gradient by less than this ...
CLIP_SMALL_NORM = 0.1  # ... and the threshold itself is this small: the threshold is the mistake
SGD_CLIP_FACTOR = 0.02  # SGD: a clip that divides the first gradient by 50 or more sets the step size


@dataclass
class GroupStep:
    """One parameter group's sampled weights and gradients around the step."""

    index: int
    names: list[str]
    lr: float | None
    settings: dict[str, Any]
    before: torch.Tensor
    grad: torch.Tensor
    after: torch.Tensor | None = None
    values: int = 0  # values in the group's tensors that had a gradient
    resolution: float = float(torch.finfo(torch.float32).eps)  # of the weights' dtype
    rule: str | None = None  # "sgd" | "adam" | "adamw": a first step from empty state whose update is known
    family: str | None = None  # the same, whatever the optimizer's state: Adam moves a weight ~lr a step anyway
    had_state: bool = False  # the optimizer held state for these parameters before the step (load_state_dict)
    # Per sampled value: its tensor was initialised far below torch's default for its fan-in (an FNO's
    # spectral weights at 1 / (in * out)): Adam's lr-sized steps, not the init, set its scale.
    small_init: torch.Tensor | None = None
    # Parameters whose gradient an optimizer step pre-hook cut to under HOOK_CUT of its norm:
    # (name, kept share, whether the weights are all zero).
    cut_in_hook: list[tuple[str, float, bool]] = field(default_factory=list)

    def should_move(self) -> bool:
        """Some weight's first update is well above what its dtype can record. SGD moves a
        weight by lr * |g| and Adam's family by about lr, so lr * min(|g|, 1) bounds both from
        below. A warmup that starts at lr * 1e-8 legitimately changes nothing in fp32."""
        if not self.lr:
            return False
        step = self.lr * self.grad.abs().clamp(max=1.0)
        return bool((step > 16 * self.resolution * self.before.abs()).float().mean() >= 0.01)

    @property
    def delta(self) -> torch.Tensor:
        assert self.after is not None
        return self.after - self.before


SMALL_INIT = 1 / 8  # of the median |weight| torch's default init gives a tensor of this fan-in


def initialised_small(param: torch.Tensor, sample: torch.Tensor) -> bool:
    """A matrix whose median |weight| is under SMALL_INIT of what torch's default init
    (uniform in +-1/sqrt(fan_in), median 1/(2 sqrt(fan_in))) gives: initialised small on
    purpose, and not zero."""
    if param.dim() < 2 or not sample.numel():
        return False
    fan_in = param[0].numel()
    median = float(sample.abs().median())
    return 0 < median < SMALL_INIT / (2 * math.sqrt(fan_in))


def _sample(tensor: torch.Tensor) -> torch.Tensor:
    """A fixed strided sample of ``tensor``'s values, as float32 on the CPU. A sharded DTensor
    gives this rank's shard: reshaping the whole would start a collective."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    flat = local.detach().reshape(-1)
    stride = max(1, math.ceil(flat.numel() / SAMPLE_PER_PARAM))
    return flat[::stride].to("cpu", torch.float32, copy=True)


# Optimizers whose first step from empty state is a closed formula (exact types: a subclass
# may change step()).
KNOWN_RULES = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw"}
UNDONE_RATIO = 0.05  # the weights moved under this share of what the optimizer's own rule moves them
HOOK_CUT = 0.01  # a step pre-hook leaves a gradient under this share of its norm


def expected_first_update(step: GroupStep) -> torch.Tensor | None:
    """The update the optimizer's rule makes on its first step, on the sampled values."""
    if step.rule is None or step.lr is None or step.settings.get("maximize"):
        return None
    lr, weights, grad = step.lr, step.before, step.grad
    decay = as_float(step.settings.get("weight_decay")) or 0.0
    if step.rule == "sgd":
        direction = grad + decay * weights
        if step.settings.get("nesterov"):
            direction = direction * (1 + (as_float(step.settings.get("momentum")) or 0.0))
        return -lr * direction
    eps = as_float(step.settings.get("eps")) or 0.0
    if step.rule == "adam":
        coupled = grad + decay * weights
        return -lr * coupled / (coupled.abs() + eps)
    return -lr * decay * weights - lr * grad / (grad.abs() + eps)


@dataclass
class UpdateRecorder:
    """``before_step`` as the step runner's last hook before ``optimizer.step()``,
    ``after_step`` once it returned. Best effort: a parameter it cannot read (a sharded
    DTensor, a custom type) is left out, and a group with none is not audited."""

    optimizer: Any
    names: dict[torch.Tensor, str]
    groups: list[GroupStep] = field(default_factory=list)
    symmetric: list[str] = field(default_factory=list)  # weights whose units are and stay identical
    _tracked: list[tuple[GroupStep, list[torch.Tensor]]] = field(default_factory=list)
    _norms: dict[torch.Tensor, float] = field(default_factory=dict)
    _hook: Any = None

    def before_step(self) -> None:
        self.groups, self._tracked, self._norms = [], [], {}
        register = getattr(self.optimizer, "register_step_pre_hook", None)
        if callable(register):
            # Registered last, so it runs after the user's own pre-hooks: what step() really reads.
            self._hook = register(lambda optimizer, args, kwargs: self._in_step())
        self.symmetric = [self.names.get(p, "?") for group in getattr(self.optimizer, "param_groups", [])
                          for p in group.get("params", []) if symmetric_units(p)]
        for index, group in enumerate(getattr(self.optimizer, "param_groups", [])):
            params = [p for p in group.get("params", []) if isinstance(p, torch.Tensor) and p.grad is not None]
            try:
                weights = [_sample(p) for p in params]
                grads = [_sample(p.grad) for p in params]
            except Exception:  # noqa: BLE001 - an unreadable tensor type: no audit for this group
                continue
            if not params:
                continue
            settings = {key: group[key] for key in ("weight_decay", "eps", "betas", "maximize", "momentum",
                                                     "nesterov", "initial_lr") if key in group}
            step = GroupStep(index, [self.names.get(p, "?") for p in params], as_float(group.get("lr")), settings,
                             torch.cat(weights), torch.cat(grads), values=sum(p.numel() for p in params),
                             small_init=torch.cat([torch.full_like(w, float(initialised_small(p, w)), dtype=torch.bool)
                                                   for p, w in zip(params, weights, strict=True)]))
            if params[0].is_floating_point():
                step.resolution = float(torch.finfo(params[0].dtype).eps)
            state = getattr(self.optimizer, "state", {})
            step.family = KNOWN_RULES.get(type(self.optimizer))
            step.had_state = any(state.get(p) for p in params)
            if step.family is not None and not step.had_state:
                step.rule = step.family
            self.groups.append(step)
            self._tracked.append((step, params))
            for param in params:
                self._norms[param] = float(param.grad.detach().float().norm())

    def _in_step(self) -> None:
        for step, params in self._tracked:
            for param in params:
                before = self._norms.get(param, 0.0)
                if param.grad is None or before <= 0:
                    continue
                kept = float(param.grad.detach().float().norm()) / before
                if kept < HOOK_CUT:
                    step.cut_in_hook.append((self.names.get(param, "?"), kept, not bool(param.detach().any())))

    def after_step(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        for step, params in self._tracked:
            try:
                step.after = torch.cat([_sample(p) for p in params])
            except Exception:  # noqa: BLE001
                step.after = None
        self.groups = [step for step in self.groups if step.after is not None]
        self._tracked = []


def symmetric_units(param: Any) -> bool:
    """A weight (out, in, ...) whose units (rows) are all identical and whose gradient rows
    are identical too: a constant initialisation (nn.init.constant_, ones, a fill_) of
    every layer. Identical units get identical updates forever, so the layer computes one
    feature however wide it is. A zero-initialised layer next to random ones gets different
    gradient rows (LoRA's B, a zero-init head or residual branch): not symmetric."""
    if not isinstance(param, torch.Tensor) or param.grad is None or param.dim() < 2 or param.shape[0] < 2:
        return False
    if hasattr(param, "to_local") or param.grad.is_sparse:
        return False
    with torch.no_grad():
        weight, grad = param.detach(), param.grad.detach()
        if not torch.equal(weight[0], weight[1]):  # two rows tell most weights apart without a full pass
            return False
        if weight[0].numel() == 1 and not bool(grad.any()):
            # A table of one value per row (a user-bias nn.Embedding(n, 1)) that the loss cancels (a
            # pairwise BPR difference): no units to be alike, nothing learned there by design.
            return False
        return bool((weight == weight[:1]).all()) and bool(torch.allclose(grad, grad[:1].expand_as(grad)))


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    denominator = float(a.norm() * b.norm())
    return float(a @ b) / denominator if denominator > 0 else 0.0


def _group(step: GroupStep, total_groups: int) -> str:
    shown = ", ".join(step.names[:3]) + (f" and {len(step.names) - 3} more" if len(step.names) > 3 else "")
    where = "the optimizer's only parameter group" if total_groups == 1 else f"parameter group {step.index}"
    return f"{where} ({shown})"


def _finite(step: GroupStep) -> bool:
    return bool(torch.isfinite(step.before).all() and torch.isfinite(step.grad).all()
                and step.after is not None and torch.isfinite(step.after).all())


def update_findings(groups: list[GroupStep], *, optimizer_name: str, grad_norm: float | None,
                    clip_grad_norm: float | None, run_lr_multiple: float | None = None,
                    max_steps: int | None = None, peak_lr_multiple: float | None = None,
                    built_lr: float | None = None) -> list[Finding]:
    """The findings of one observed step (``UpdateRecorder.groups``). ``run_lr_multiple``:
    the learning rates of all ``max_steps`` steps summed, in units of the first step's;
    ``peak_lr_multiple``: the schedule's highest learning rate in those units; ``built_lr``:
    the lr the optimizer was constructed with (``optimizer.defaults``)."""
    found: list[Finding] = []
    audited = [step for step in groups if _finite(step) and float(step.grad.abs().max()) > 0]
    moving = [step for step in audited if step.lr is None or step.lr > 0]
    expected = [step for step in moving if step.should_move()]
    if expected and all(float(step.delta.abs().max()) == 0 for step in moving):
        found.append(_unchanged(expected, optimizer_name))
        return found
    for step in moving:
        delta = step.delta
        if float(delta.abs().max()) == 0:
            continue
        ascent = _ascent(step, delta, len(groups), optimizer_name)
        if ascent is not None:
            found.append(ascent)
            continue
        if step.cut_in_hook:
            found.append(_cut_in_hook(step, optimizer_name))
            continue
        rounded = _rounded(step, delta, len(groups))
        if rounded is not None:
            found.append(rounded)
            continue
        undone = _undone(step, delta, len(groups), optimizer_name)
        if undone is not None:
            found.append(undone)
            continue
        # Before the foreign-update test: a decay added in a hook also points away from the rule's
        # step, but straight at -weights, which names it.
        decay = _decay(step, delta, len(groups))
        foreign = None if decay is not None else _not_the_rule(step, delta, len(groups), optimizer_name)
        if foreign is not None:
            found.append(foreign)
            continue
        if decay is not None:
            found.append(decay)
        elif (large := _too_large(step, delta, len(groups))) is not None:
            found.append(large)
        elif (peak := _too_large_at_peak(step, delta, len(groups), peak_lr_multiple)) is not None:
            found.append(peak)
        eps = _eps(step, len(groups), optimizer_name)
        if eps is not None:
            found.append(eps)
    if not found and run_lr_multiple is not None and max_steps:
        small = _too_small(moving, run_lr_multiple, max_steps, built_lr)
        if small is not None:
            found.append(small)
    swapped = [_betas(step, len(groups), optimizer_name) for step in audited]
    found.extend(next(([finding] for finding in swapped if finding is not None), []))
    clipped = _clip(grad_norm, clip_grad_norm, sgd=any(step.family == "sgd" for step in moving))
    if clipped is not None:
        found.append(clipped)
    return found


def _unchanged(moving: list[GroupStep], optimizer_name: str) -> Finding:
    rates = ", ".join(f"{step.lr:g}" for step in moving if step.lr is not None) or "unknown"
    return Finding(
        "UPDATE_NONE", "error",
        f"the first optimizer step changed no weight: {optimizer_name}.step() received non-zero gradients "
        f"(lr {rates}) and left every parameter exactly as it was, so no step will train the model. A step() "
        "that calls zero_grad() (or sets p.grad = None) before updating, returns early, or updates copies of the "
        "parameters does this",
        "Make optimizer.step() apply p.grad before anything clears it: call zero_grad() after step() (or at the "
        "start of the next iteration), never inside step() before the update.",
    )


def _ascent(step: GroupStep, delta: torch.Tensor, total: int, optimizer_name: str) -> Finding | None:
    cosine = _cosine(delta, -step.grad)
    if cosine >= ASCENT_COSINE:
        return None
    if step.settings.get("maximize"):
        return Finding(
            "UPDATE_ASCENT", "error",
            f"{_group(step, total)} has maximize=True: {optimizer_name} climbs the gradient, so every step raises "
            f"the loss instead of lowering it (the first step moved the weights along +gradient, cosine "
            f"{-cosine:.2f})",
            "Remove maximize=True from the optimizer (it is for objectives to maximise, such as a reward); to "
            "maximise a score, return its negative as the loss.",
        )
    return Finding(
        "UPDATE_ASCENT", "error",
        f"the first step moved {_group(step, total)} up the gradient (cosine {-cosine:.2f} with +gradient): the "
        f"optimizer's step adds the gradient instead of subtracting it, so the loss rises",
        "In a custom step(), subtract the update (p.add_(update, alpha=-lr)); check the sign of a hand-written "
        "update rule.",
    )


def _decay(step: GroupStep, delta: torch.Tensor, total: int) -> Finding | None:
    decay = as_float(step.settings.get("weight_decay")) or 0.0
    weights = step.before
    size = float(weights @ weights)
    if size == 0:
        return None
    shrink = float(-(delta @ weights)) / size  # the share of the weights' size the step took away
    if shrink < DECAY_SHRINK or _cosine(delta, -weights) < DECAY_COSINE:
        return None
    left = (1 - min(shrink, 1.0)) ** 100
    lr = f" with lr={step.lr:g}" if step.lr is not None else ""
    if decay <= 0:
        return Finding(
            "UPDATE_WEIGHT_DECAY", "error" if shrink >= DECAY_ERROR_SHRINK else "warning",
            f"the first step shrinks {_group(step, total)} by {shrink:.1%} (cosine {_cosine(delta, -weights):.2f} "
            f"with -weights), although the optimizer's weight_decay is 0{lr}: something inside optimizer.step() "
            "decays the weights, e.g. a step pre-hook doing p.mul_(1 - weight_decay) without the learning rate: "
            "AdamW's decoupled decay is p *= 1 - lr * weight_decay, so the hook decays 1/lr times too hard, and after "
            f"100 steps the weights keep {left:.2g} of their size",
            "Multiply by the learning rate in the hook, p.mul_(1 - group['lr'] * weight_decay), or drop the hook and "
            "use torch.optim.AdamW(..., weight_decay=...), which applies the decoupled decay itself.",
        )
    return Finding(
        "UPDATE_WEIGHT_DECAY", "error" if shrink >= DECAY_ERROR_SHRINK else "warning",
        f"weight_decay={decay:g}{lr} shrinks {_group(step, total)} by {shrink:.1%} at every step: the first update "
        f"is mostly a pull towards 0 (cosine {_cosine(delta, -weights):.2f} with -weights), not the gradient, and "
        f"after 100 steps the weights keep {left:.2g} of their size unless the gradient holds them up",
        "Set weight_decay to a usual value (1e-4 to 5e-4 for SGD, 0.01 to 0.1 for AdamW's decoupled decay): "
        f"a value like {decay:g} is often {decay:g}e-4 with its exponent lost.",
    )


HALF_RESOLUTION = 1e-4  # the dtype's eps above which weights are bf16/fp16
# Of the weights the rule moves, left exactly where they were. Adam's first step, lr * sign(g), is
# the largest it takes, so under Adam these weights stay frozen for good: a quarter is too many.
ROUNDED_SHARE = 0.25
MIN_RECORDABLE = 64
LATER_STEP = 0.5  # of the first step: the size of a later, noisier Adam step
FOREIGN_COSINE = 0.2  # the update's cosine with the rule's step (exactly 1 when step() is the rule alone)


def half_spacing(weights: torch.Tensor, resolution: float) -> torch.Tensor:
    """Half the distance to the next number of the weights' dtype (its eps is ``resolution``)
    above each weight: an update smaller than this rounds away."""
    magnitude = weights.abs().clamp_min(torch.finfo(torch.float32).tiny)
    return torch.exp2(torch.floor(torch.log2(magnitude))) * resolution / 2


def _rounded(step: GroupStep, delta: torch.Tensor, total: int) -> Finding | None:
    """Half-precision weights whose updates round away: the rule moves them, the dtype cannot."""
    expected = expected_first_update(step)
    if expected is None or step.resolution <= HALF_RESOLUTION:
        return None
    moving = expected.abs() > 0
    if int(moving.sum()) == 0:
        return None
    unmoved = float(((delta == 0) & moving).sum()) / float(moving.sum())
    # Adam's first step, lr * sign(g), is its largest: once the gradient's sign varies between
    # steps, m / sqrt(v) falls below one and the steps shrink. A weight whose half spacing exceeds
    # half the first step rounds those away, even where the first step itself rounded up.
    fragile = float(((half_spacing(step.before, step.resolution) > expected.abs() * LATER_STEP) & moving).sum()) \
        / float(moving.sum())
    if unmoved < ROUNDED_SHARE and fragile < ROUNDED_SHARE:
        return None
    dtype = "bfloat16" if step.resolution > 1e-3 else "float16"
    return Finding(
        "UPDATE_ROUNDED", "warning",
        f"{_group(step, total)} holds {dtype} weights (parameters stored in {dtype}, no float32 master copy): "
        f"{unmoved:.0%} of them did not change in the first step although the optimizer moved them (lr={step.lr:g}), "
        f"and {fragile:.0%} sit where an update half that size is smaller than half the spacing between {dtype} "
        "numbers near the weight, so it rounds away: once the steps shrink below the first one most weights stop "
        "training",
        "Keep the weights in float32 and compute in half precision with autocast (trainer.precision=bf16-mixed, "
        "torch.autocast), or use an optimizer with float32 master weights; do not call model.to(torch.bfloat16) "
        "for training.",
    )


def _not_the_rule(step: GroupStep, delta: torch.Tensor, total: int, optimizer_name: str) -> Finding | None:
    """An update pointing elsewhere than the rule's step on these gradients (whose cosine with it
    is exactly 1 when step() applies the rule alone): noise or another term added inside
    optimizer.step() (a step pre-hook), after the gradients were read. Adam's first step has
    the rule's size whatever is added, so the direction is the evidence, not the size."""
    expected = expected_first_update(step)
    if expected is None or not step.should_move():
        return None
    # Only where the rule's step is large enough for the dtype to record: elsewhere (a warmup
    # from lr x 1e-9) the weights rightly stay put and say nothing about the direction.
    recordable = expected.abs() > 16 * step.resolution * step.before.abs()
    if int(recordable.sum()) < MIN_RECORDABLE:
        return None
    delta, expected = delta[recordable], expected[recordable]
    size = float(delta.norm()) / max(float(expected.norm()), 1e-30)
    cosine = _cosine(delta, expected)
    if cosine >= FOREIGN_COSINE:
        return None
    return Finding(
        "UPDATE_NOT_GRADIENT", "warning",
        f"the first step moved {_group(step, total)} {size:.2g}x as far as {optimizer_name}'s rule does on these "
        f"gradients, in a direction nearly unrelated to it (cosine {cosine:.2f}): something adds "
        "to the update inside optimizer.step(), e.g. noise from a step pre-hook, and it drowns the gradient. "
        "Differentially private SGD's noise std noise_multiplier * max_grad_norm belongs to the SUM of per-sample "
        "gradients: on a batch-mean gradient it must be divided by the batch size",
        "Scale what the hook adds to the gradient it is added to (for DP-SGD on a mean gradient: std = "
        "noise_multiplier * max_grad_norm / batch_size), or use Opacus, which clips per sample and calibrates the "
        "noise.",
    )


def _cut_in_hook(step: GroupStep, optimizer_name: str) -> Finding:
    names = ", ".join(name for name, _, _ in step.cut_in_hook[:4]) + (" ..." if len(step.cut_in_hook) > 4 else "")
    kept = max(share for _, share, _ in step.cut_in_hook)
    zero = [name for name, _, all_zero in step.cut_in_hook if all_zero]
    if zero:
        why = (f"{', '.join(zero[:4])} hold only zeros (a zero-initialised layer), and a clip relative to the "
               "weights' norm (adaptive gradient clipping, AGC, as in NFNets: max_norm = clip * ||w||) leaves a "
               "zero weight no gradient, so the layer stays at zero for the whole run")
        fix = ("Leave the zero-initialised layer (the final classifier) out of the adaptive clipping, as the NFNet "
               "paper does: pass only the other parameters to the hook, or clamp the weight norm with a larger eps.")
    else:
        why = "a clipping or rescaling in the hook whose threshold is far below the gradients' size"
        fix = "Check the hook's threshold against the gradients' norms (print them for one step), or remove the hook."
    return Finding(
        "GRAD_CUT_IN_STEP_HOOK", "error",
        f"an optimizer step pre-hook (register_step_pre_hook) cuts the gradients of {names} to under "
        f"{max(kept, 1e-12):.2g}x their size before {optimizer_name}.step() reads them: {why}",
        fix,
    )


def _undone(step: GroupStep, delta: torch.Tensor, total: int, optimizer_name: str) -> Finding | None:
    expected = expected_first_update(step)
    if expected is None or not step.should_move():
        return None
    ratio = float(delta.norm()) / max(float(expected.norm()), 1e-30)
    if ratio >= UNDONE_RATIO:
        return None
    return Finding(
        "UPDATE_UNDONE", "error",
        f"the first step moved {_group(step, total)} by {ratio:.2%} of what {optimizer_name}'s own update rule "
        "computes from these gradients: something after optimizer.step() pulls the weights back (an optimizer step "
        "hook or a callback that writes an EMA or a saved copy into the live parameters), so the model barely "
        "trains",
        "Update the copy, not the model: ema_p.mul_(decay).add_(p.detach(), alpha=1 - decay) for the EMA's own "
        "parameters (torch.optim.swa_utils.AveragedModel does this); never assign into the trained parameters after "
        "the step.",
    )


def typical_change(step: GroupStep, delta: torch.Tensor) -> tuple[float, float] | None:
    """(median |update|, median |weight|) over the group's weights that are not zero: the rms
    is carried by a few large weights (LayerNorm's ones beside a transformer's N(0, 0.02)
    matrices), the median by the matrices; zero-initialised biases and LoRA's B have no size."""
    sized = (step.before.abs() > 0) & ~small_init_mask(step)
    if int(sized.sum()) < MIN_RECORDABLE:
        return None
    weight = float(step.before.abs()[sized].median())
    return float(delta.abs()[sized].median()), weight


def small_init_mask(step: GroupStep) -> torch.Tensor:
    """The sampled values of tensors initialised small on purpose (``initialised_small``)."""
    return step.small_init if step.small_init is not None else torch.zeros_like(step.before, dtype=torch.bool)


def _too_large(step: GroupStep, delta: torch.Tensor, total: int) -> Finding | None:
    kept = ~small_init_mask(step)
    if not bool(kept.any()):
        return None
    weight_rms = float(step.before[kept].pow(2).mean().sqrt())
    update_rms = float(delta[kept].pow(2).mean().sqrt())
    typical = typical_change(step, delta)
    if typical is not None and typical[1] >= MIN_WEIGHT_RMS and typical[0] >= UPDATE_OVER_WEIGHTS * typical[1] \
            and update_rms < UPDATE_OVER_WEIGHTS * weight_rms:
        update_rms, weight_rms = typical  # the typical weight's change, named as such below
        sizes = "median |update|, median |weight|"
    else:
        sizes = "update rms, weights rms"
    if weight_rms < MIN_WEIGHT_RMS or update_rms < UPDATE_OVER_WEIGHTS * weight_rms:
        return None
    lr = f" at lr={step.lr:g}" if step.lr is not None else ""
    first, second = sizes.split(", ")
    return Finding(
        "UPDATE_TOO_LARGE", "warning",
        f"the first step changed {_group(step, total)} by {update_rms / weight_rms:.1f}x the size of its weights "
        f"({first} {update_rms:.3g}, {second} {weight_rms:.3g}){lr}: the initialisation is overwritten at once, "
        "and a step this large usually makes the loss explode (healthy first steps are 0.1% to 5% of the weights)",
        "Lower the learning rate (Adam/AdamW: 1e-4 to 3e-3; SGD: 0.01 to 0.1), or measure it with the LR finder "
        "(preflight.lr_finder=true; lr_finder=True in run_preflight); a warmup also tames the first steps.",
    )


def _too_large_at_peak(step: GroupStep, delta: torch.Tensor, total: int, multiple: float | None) -> Finding | None:
    """An Adam-family step whose size, scaled to the schedule's peak learning rate, would be
    larger than the weights: Adam moves each weight by about lr per step whatever the gradient,
    so the first update times (peak lr / first lr) is the update at the peak."""
    if step.rule not in ("adam", "adamw") or not multiple or multiple <= 1 or not step.lr:
        return None
    weight_rms = float(step.before.pow(2).mean().sqrt())
    at_peak = float(delta.pow(2).mean().sqrt()) * multiple
    if weight_rms < MIN_WEIGHT_RMS or at_peak < UPDATE_OVER_WEIGHTS * weight_rms:
        return None
    peak = step.lr * multiple
    return Finding(
        "UPDATE_TOO_LARGE", "warning",
        f"the LR schedule rises to lr={peak:.3g} ({multiple:.3g}x the first step's {step.lr:.3g}), and at that rate "
        f"one step of {_group(step, total)} would change it by about {at_peak / weight_rms:.1f}x the size of its "
        f"weights (Adam moves each weight by about lr per step; weights rms {weight_rms:.3g}): past the warmup the "
        "weights are overwritten at every step and the loss explodes or sticks. A peak learning rate meant for SGD "
        "(OneCycleLR(max_lr=1.0), a warmup to 0.1-1) given to Adam does this (healthy steps are 0.1% to 5% of the "
        "weights)",
        "Lower the schedule's peak for Adam/AdamW to 1e-4 to 3e-3 (OneCycleLR(max_lr=3e-3), or the optimizer's lr "
        "a warmup rises to), or measure it with the LR finder (preflight.lr_finder=true; lr_finder=True in "
        "run_preflight).",
    )


RESTORED_LR_DROP = 10.0  # a group's lr this many times below the lr the optimizer was built with


def _too_small(moving: list[GroupStep], run_lr_multiple: float, max_steps: int,
               built_lr: float | None = None) -> Finding | None:
    """Every group's weights would move by under ``RUN_MOVEMENT`` of their size over the whole
    run even if each step's update pointed the same way: the first update's size, scaled by
    the schedule's summed learning rate. An upper bound, so a healthy short run never fires
    (healthy first steps move 0.07% to 5% of the weights; 0.5% is reached in 7 steps). Only
    for optimizers whose first step bounds the later ones: Adam/AdamW move each weight by
    about lr per step from the first; SGD gets its momentum's 1/(1 - m) and gradients that
    grow 10x as headroom. RAdam's first steps are a rectified warmup and say nothing.
    An optimizer that already held state (``load_state_dict`` of a checkpoint) is judged by
    its family's bound too: Adam's step stays about lr whatever its moments."""
    bounds = []
    for step in moving:
        weight_rms = float(step.before.pow(2).mean().sqrt())
        update_rms = float(step.delta.pow(2).mean().sqrt())
        if weight_rms < MIN_WEIGHT_RMS or not step.lr or step.family is None:
            return None  # a group the bound cannot speak for: RAdam's rectified warmup, Adagrad's decay, ...
        headroom = 1.0
        if step.family == "sgd":  # momentum builds to 1/(1 - m) steps' worth; gradients may grow 10x
            headroom = SGD_GRADIENT_GROWTH / max(1e-3, 1.0 - float(step.settings.get("momentum", 0.0) or 0.0))
        bounds.append((update_rms / weight_rms * run_lr_multiple * headroom, step))
    if not bounds or max(bound for bound, _ in bounds) >= RUN_MOVEMENT:
        return None
    largest, step = max(bounds, key=lambda pair: pair[0])
    restored = step.had_state and built_lr is not None and step.lr is not None and built_lr > RESTORED_LR_DROP * step.lr
    return Finding(
        "UPDATE_TOO_SMALL", "warning",
        f"the learning rate is too small to train: the first step moved the weights by "
        f"{float(step.delta.pow(2).mean().sqrt()) / float(step.before.pow(2).mean().sqrt()):.1e} of their size "
        f"(lr={step.lr:g}), and over trainer.max_steps={max_steps} steps of this schedule even updates that all "
        f"pointed the same way would move them by at most {largest:.2%}. The model ends where it started"
        + (f". The optimizer was built with lr={built_lr:g} and already held state for these weights: "
           "optimizer.load_state_dict(checkpoint['optimizer']) restored the saved param_groups, lr included, so the "
           f"lr is the checkpoint's (lr={step.lr:g}, where its finished run's schedule ended), not the one passed "
           "to the constructor" if restored else ""),
        ("Start a new run (a fine-tune on other data) with a fresh optimizer: drop "
         "optimizer.load_state_dict(checkpoint['optimizer']), or set each param_group['lr'] (and 'initial_lr') "
         "back after loading; load the optimizer state only to continue the same run with its scheduler. "
         if restored else "")
        + "Raise the learning rate (Adam/AdamW: 1e-4 to 3e-3; SGD: 0.01 to 0.1), and check the scheduler: a LambdaLR "
        "must return a factor of the base lr, not the lr itself; a StepLR/ExponentialLR sized in epochs must be "
        "stepped once per epoch, not per batch.",
    )


def _eps(step: GroupStep, total: int, optimizer_name: str) -> Finding | None:
    eps = as_float(step.settings.get("eps"))
    if eps is None or "betas" not in step.settings:  # Adam's family: g / (sqrt(v) + eps)
        return None
    magnitudes = step.grad.abs()
    magnitudes = magnitudes[magnitudes > 0]
    if magnitudes.numel() == 0:
        return None
    median = float(magnitudes.median())
    if eps < EPS_USUAL_MAX or eps < EPS_OVER_GRAD * median:
        return None
    return Finding(
        "UPDATE_EPS", "warning",
        f"{optimizer_name} eps={eps:g} in {_group(step, total)} is {eps / median:,.0f}x the gradients' median size "
        f"({median:.2g}): the update g / (sqrt(v) + eps) is about g / eps, so each step is ~{eps / median:,.0f}x "
        "smaller than the learning rate asks and the model barely moves",
        "Use eps=1e-8 (the default; 1e-6 at most for half-precision optimizer state): eps only guards the "
        "division, it is not a step-size knob.",
    )


def _betas(step: GroupStep, total: int, optimizer_name: str) -> Finding | None:
    """Adam's betas in the wrong order: the first moment (the update's direction) averaged
    over ~1/(1 - beta1) steps, the second (its scale) over ~1/(1 - beta2). beta1 > beta2 makes
    the direction lag hundreds of steps behind while the scale jumps with every batch;
    no published setting has it (Adam/AdamW 0.9/0.999, LLMs 0.9/0.95, GANs 0.5/0.999, Lion 0.9/0.99)."""
    betas = step.settings.get("betas")
    try:
        beta1, beta2 = (float(beta) for beta in betas)
    except (TypeError, ValueError):
        return None
    if beta1 <= beta2:
        return None
    return Finding(
        "UPDATE_BETAS", "warning",
        f"{optimizer_name} betas=({beta1:g}, {beta2:g}) in {_group(step, total)}: beta1 > beta2, so the gradient's "
        f"direction is averaged over ~{1 / (1 - beta1):.0f} steps and its scale over only ~{1 / (1 - beta2):.0f}: "
        "the two values look swapped",
        f"Use betas=({beta2:g}, {beta1:g}), beta1 (momentum) first: (0.9, 0.999) is Adam's default, (0.9, 0.95) "
        "common for transformers.",
    )


def _clip(grad_norm: float | None, clip_grad_norm: float | None, sgd: bool = False) -> Finding | None:
    """UPDATE_CLIPPED: a clip of 0, a tiny clip far below the gradients, or (SGD) a clip the
    gradients exceed many times: SGD's step is lr times the clipped gradient, so the clip
    sets the step size, unlike Adam's, which divides the clipped gradient by its own scale."""
    if clip_grad_norm is not None and clip_grad_norm == 0 and grad_norm:
        return Finding(
            "UPDATE_CLIPPED", "error",
            f"clip_grad_norm=0.0 clips every gradient to norm 0 (the first step's had norm {grad_norm:.3g}): "
            "torch.nn.utils.clip_grad_norm_(params, 0.0) multiplies the gradients by 0, so no weight ever moves. "
            "A config where 0 means 'no clipping' (max_grad_norm: 0) passed straight to the clip does this",
            "Pass clip_grad_norm=None (trainer.clip_grad_norm=null) to turn clipping off, or a positive norm such as "
            "1.0 to clip; map a config's 0 to None before the loop.",
        )
    if not clip_grad_norm or not grad_norm or not math.isfinite(grad_norm):
        return None
    factor = clip_grad_norm / grad_norm
    if clip_grad_norm < CLIP_SMALL_NORM and factor < CLIP_FACTOR:
        return Finding(
            "UPDATE_CLIPPED", "warning",
            f"clip_grad_norm={clip_grad_norm:g} scales the first step's gradient (norm {grad_norm:.3g}) down "
            f"{1 / factor:,.0f}x: every update is that much smaller than the learning rate asks, so the model barely "
            "moves",
            "Clip at a norm near the gradients' usual size (trainer.clip_grad_norm=1.0 is common), or leave clipping "
            "off; a tiny value here is often another setting (a weight decay or learning rate) in the wrong slot.",
        )
    if sgd and factor < SGD_CLIP_FACTOR:
        return Finding(
            "UPDATE_CLIPPED", "warning",
            f"clip_grad_norm={clip_grad_norm:g} scales the first step's gradient (norm {grad_norm:.3g}) down "
            f"{1 / factor:,.0f}x, and SGD's step is the learning rate times the clipped gradient: every step that is "
            f"clipped moves the weights {1 / factor:,.0f}x less than lr asks (at most lr x {clip_grad_norm:g} in "
            "norm, times 1/(1 - momentum)), so the model creeps towards the targets and ends the run far from them. "
            "A clip value copied from a recipe built for Adam/AdamW (DETR's 0.1), where clipping does not set the "
            "step size, does this",
            f"Clip near the gradients' usual size (clip_grad_norm of {grad_norm:.2g} or more here, or 1.0 after "
            "standardising the targets), or leave clipping off with SGD; keep a tight clip only with Adam/AdamW.",
        )
    return None

