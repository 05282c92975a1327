"""A dropout probability that reads like a keep-probability (``model.dropout_rate``).

torch's ``p`` (``nn.Dropout(p)``, ``F.dropout(x, p)``, ``nn.LSTM(dropout=...)``, Hugging
Face's ``hidden_dropout_prob``, ``attention_probs_dropout_prob``, ``resid_pdrop``, ...) is
the probability of *zeroing* an activation; TensorFlow 1's ``keep_prob`` and some papers
give the probability of keeping it. 0.1-0.5 is the usual range (0.5 on wide fully
connected layers is classic; AWD-LSTM's 0.65 on embeddings is about the highest on purpose);
at 0.75 and above three in four activations are dropped every step, which is almost always a keep-probability typed into a drop-probability. At 1.0
every activation is zeroed and nothing downstream can learn.

Read from the modules (dropout layers, and float attributes named like a dropout rate:
what a layer hands to ``F.dropout`` or ``scaled_dot_product_attention(dropout_p=...)``),
from Hugging Face configs (every float field named like one, nested configs too), and
from one no-grad training-mode forward on the first batch that records the rate of
every dropout call (``F.dropout(x, 0.9)`` with the rate written in the forward).
The modules and configs of frozen parts are not read (a frozen teacher kept in eval mode
never drops anything in training); the forward shows where their dropout does run.
"""

from __future__ import annotations

import contextlib
import re
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.analyses.random_masks import RandomMaskWatch
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

KEEP_LIKE = 0.75  # p at or above this reads as a keep-probability (keep_prob 0.75, 0.8, 0.9)
# dropout, attention_dropout, hidden_dropout_prob, resid_pdrop, drop_rate, drop_path_rate,
# dropout_p; not keep_prob, use_dropout (a bool) or layerdrop's siblings with another meaning.
RATE_NAME = re.compile(r"(dropout|pdrop|drop_prob|drop_rate|drop_path)", re.IGNORECASE)
CONFIG_DEPTH = 2  # a multimodal config's text_config / vision_config


def _is_rate(name: str, value: Any) -> bool:
    return isinstance(value, float) and not isinstance(value, bool) and RATE_NAME.search(name) is not None


def _trains(module: nn.Module) -> bool:
    params = list(module.parameters())
    return not params or any(param.requires_grad for param in params)


def _label(name: str, module: nn.Module) -> str:
    return f"{name} ({type(module).__name__})" if name else type(module).__name__


def module_rates(model: nn.Module) -> dict[str, tuple[str, float]]:
    """``{module name: (label, p)}`` for rates at or above KEEP_LIKE that the modules of
    parts that train hold: a dropout layer's ``p``, or a float attribute named like a rate."""
    found: dict[str, tuple[str, float]] = {}
    parents = dict(model.named_modules())
    for name, module in parents.items():
        parent = parents[name.rpartition(".")[0]] if name else module
        if not _trains(parent):
            continue
        if isinstance(module, nn.modules.dropout._DropoutNd):
            if module.p >= KEEP_LIKE:
                found[name] = (_label(name, module), float(module.p))
            continue
        for attribute, value in vars(module).items():
            if _is_rate(attribute, value) and value >= KEEP_LIKE:
                found.setdefault(name, (f"{name + '.' if name else ''}{attribute} ({type(module).__name__})", value))
    return found


def _config_fields(config: Any, prefix: str, depth: int) -> dict[str, float]:
    found: dict[str, float] = {}
    for key, value in vars(config).items():
        if key.startswith("_"):
            continue
        if _is_rate(key, value) and value >= KEEP_LIKE:
            found[f"{prefix}{key}"] = value
        elif depth > 0 and hasattr(value, "to_dict") and hasattr(value, "__dict__"):  # a nested config
            found.update(_config_fields(value, f"{prefix}{key}.", depth - 1))
    return found


def config_rates(model: nn.Module) -> dict[str, float]:
    """Rates at or above KEEP_LIKE declared in the configs of the (Hugging Face) models
    inside ``model``, as ``config.<field>``."""
    found: dict[str, float] = {}
    seen: set[int] = set()
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is None or id(config) in seen or not hasattr(config, "to_dict") or not _trains(module):
            continue
        seen.add(id(config))
        found.update(_config_fields(config, "config.", CONFIG_DEPTH))
    return found


LOSS = "<loss>"
DROPOUT_FUNCTIONS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                               "feature_alpha_dropout", "feature_dropout"})


def called_rate(func: Any, args: tuple, kwargs: dict[str, Any]) -> float | None:
    """The drop probability a call applies in training: ``F.dropout``'s family (``p``,
    ``training``; torch.dropout's ``(input, p, train)``) and ``scaled_dot_product_attention``'s
    ``dropout_p``; None for any other call or one that drops nothing."""
    name = getattr(func, "__name__", "")
    if name in DROPOUT_FUNCTIONS:
        rate = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
        active = kwargs.get("training", kwargs.get("train", args[2] if len(args) > 2 else True))
    elif name == "scaled_dot_product_attention":
        rate, active = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0), True
    else:
        return None
    return float(rate) if active and isinstance(rate, (int, float)) and rate > 0 else None


class DropoutCalls(TorchFunctionMode):
    """Records the rate of each dropout call, by the innermost module running it."""

    def __init__(self, model: nn.Module, at_least: float = KEEP_LIKE):
        super().__init__()
        self.at_least = at_least
        self.rates: dict[str, float] = {}  # by module name ("" for the model, "<loss>" outside it)
        self._stack: list[str] = []
        names = {module: name for name, module in model.named_modules()}
        self._handles = [handle for module, name in names.items() for handle in (
            module.register_forward_pre_hook(lambda *_, name=name: self._enter(name)),
            module.register_forward_hook(lambda *_: self._leave()))]

    # Hooks return None: a value returned by a forward hook would replace the output.
    def _enter(self, name: str) -> None:
        self._stack.append(name)

    def _leave(self) -> None:
        if self._stack:
            self._stack.pop()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        rate = called_rate(func, args, kwargs)
        if rate is not None and rate >= self.at_least:
            self.rates.setdefault(self._stack[-1] if self._stack else LOSS, rate)
        return func(*args, **kwargs)


def watched_forward(ctx: PreflightContext, training: bool, watches: list[Any]) -> bool:
    """One no-grad forward on the first batch in the given mode under every watch (torch
    function modes with a ``close()``), weights, RNGs and modes restored; False where it fails."""
    batch = ctx.artifacts.first_batch
    try:
        if batch is None or not ctx.weights_materialized:
            return False
        with preserved_training_state(ctx), contextlib.ExitStack() as stack:
            ctx.model.train(training)
            stack.enter_context(torch.no_grad())
            stack.enter_context(ctx.training.plan.autocast())
            for watch in watches:
                stack.enter_context(watch)
            ctx.compute_loss(ctx.model, move_to_device(batch, ctx.device))
    except Exception:  # the step checks report a forward that fails
        return False
    finally:
        for watch in watches:
            watch.close()
    return True


def forward_rates(ctx: PreflightContext, *, training: bool = True, at_least: float = KEEP_LIKE) -> dict[str, float]:
    """Rates of ``at_least`` and more applied in one no-grad forward on the first batch, in
    training mode (or eval mode: what still drops there); empty where that forward fails."""
    recorder = DropoutCalls(ctx.model, at_least)
    return recorder.rates if watched_forward(ctx, training, [recorder]) else {}


def _listing(rates: dict[str, float], limit: int = 5) -> str:
    items = [f"{name}={value:g}" if name.startswith("config.") else f"{name} p={value:g}" for name, value in rates.items()]
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


class DropoutRateCheck(Check):
    """Dropout probabilities of 0.75 and more: a keep-probability given as ``p``."""

    name = "model.dropout_rate"
    stage = Stage.MODEL
    codes = ("DROPOUT_KEEP_PROB",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        configs = config_rates(ctx.model)
        modules = module_rates(ctx.model)
        # What the forward applies: also rates written into its code, which no module or
        # config holds (a module that holds its rate is named once).
        by_name = dict(ctx.model.named_modules())
        for name, rate in forward_rates(ctx).items():
            if name in modules:
                continue
            module = by_name.get(name)
            if module is None:
                label = "a dropout call in compute_loss"
            elif isinstance(module, nn.modules.dropout._DropoutNd):  # in a frozen part that trains in train mode
                label = _label(name, module)
            else:
                label = f"a dropout call in {_label(name, module)}'s forward"
            modules[name] = (label, rate)
        # Layers built from a flagged config field carry its value: name the field, once.
        unexplained = {label: p for label, p in modules.values() if p not in configs.values()}
        rates = {**configs, **unexplained}
        findings.data.update(high_rates=len(rates), highest=max(rates.values(), default=None))
        findings.data["summary"] = f"{len(rates)} dropout rate(s) of {KEEP_LIKE:g} or more"
        if not rates:
            return
        everything = [name for name, p in rates.items() if p >= 1.0]
        what = (f"of {KEEP_LIKE:g} or more drop {'every activation' if everything else 'most activations'} in "
                f"training: {_listing(rates)}. p is the probability of ZEROING an activation, not of keeping it")
        consequence = ("; at p=1 the output is all zeros and nothing after it can learn" if everything else
                       "; the network trains on a quarter of its signal or less and underfits")
        where = ("set the config field before the model is built: from_pretrained(name, hidden_dropout_prob=0.1, "
                 "...) or the config you build it from" if configs else
                 "pass the drop probability where the layers are built: nn.Dropout(p=0.1) for a keep-probability of "
                 "0.9 (p = 1 - keep_prob)")
        fix = (f"Use p = 1 - keep_prob (typically 0.1-0.5): {where}.")
        severity = "error" if everything else "warning"
        findings.add(severity, "DROPOUT_KEEP_PROB", f"{len(rates)} dropout rate(s) {what}{consequence}", fix)


class DropoutInEvalCheck(Check):
    """Dropout that still drops with the model in eval mode: ``F.dropout(x, p)`` without
    ``training=self.training`` (the functional form defaults to training=True), or an
    attention call given its ``dropout_p`` unconditionally. Validation and inference then
    see random predictions that differ from call to call."""

    name = "model.dropout_in_eval"
    stage = Stage.MODEL
    codes = ("DROPOUT_IN_EVAL",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        # One eval forward: the dropout calls that still drop, and hand-written random masks
        # (analyses/random_masks.py) that a uniform draw compared with a rate makes.
        recorder, watch = DropoutCalls(ctx.model, 1e-12), RandomMaskWatch(ctx.model)
        ran = watched_forward(ctx, False, [recorder, watch])
        rates, masks = (recorder.rates, watch.found) if ran else ({}, [])
        by_name = dict(ctx.model.named_modules())
        where = {("compute_loss" if name == LOSS else _label(name, by_name[name]) if name in by_name else name): rate
                 for name, rate in rates.items()}
        findings.data.update(active_in_eval=len(where), random_masks_in_eval=masks)
        if masks and not where:
            shown = "; ".join(masks[:3])
            findings.warning(
                "DROPOUT_IN_EVAL",
                f"the model's forward draws a random mask or decision in eval mode (torch.rand(...) compared with a "
                f"rate; {shown}). This is a hand-written dropout (modality dropout, stochastic depth, token or patch "
                "dropping) not gated by self.training, so validation and inference randomly lose a modality, a layer "
                "or tokens and predictions change from call to call",
                "Gate it on the module's mode: if self.training and torch.rand(()) < self.p: ... (or use nn.Dropout / "
                "torchvision.ops.StochasticDepth, which follow model.eval()).",
            )
            return
        findings.data["summary"] = (f"{len(where)} dropout call(s) active in eval mode" if where
                                    else "no dropout active in eval mode")
        if where:
            listing = ", ".join(f"{name} (p={rate:g})" for name, rate in list(where.items())[:5])
            findings.warning(
                "DROPOUT_IN_EVAL",
                f"dropout still drops with the model in eval mode, in {listing}: validation and inference "
                "predictions are random and differ from call to call. F.dropout(x, p) defaults to training=True, "
                "whatever the module's mode",
                "Pass the module's mode: F.dropout(x, p, training=self.training) (the same for dropout_p= of "
                "scaled_dot_product_attention: self.p if self.training else 0.0), or use an nn.Dropout layer, "
                "which follows model.eval().",
            )


REGRESSION_CRITERIA = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")


class _OutputDropout(TorchFunctionMode):
    """Keeps the outputs of the dropout calls of one forward, and the model's output."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.dropped: list[tuple[torch.Tensor, float]] = []
        self.output: list[Any] = []
        self._handle = model.register_forward_hook(self._keep)

    def _keep(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self.output:
            self.output.append(output)

    def close(self) -> None:
        self._handle.remove()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        rate = called_rate(func, args, kwargs)
        if rate is not None and getattr(func, "__name__", "") != "scaled_dot_product_attention" \
                and isinstance(out, torch.Tensor) and len(self.dropped) < 64:
            self.dropped.append((out, rate))
        return out


def output_dropout_rate(ctx: PreflightContext) -> float | None:
    """The rate of a dropout whose result is the model's output (itself or a view of it), in one
    no-grad training-mode forward on the first batch; None otherwise."""
    batch = ctx.artifacts.first_batch
    if batch is None or not ctx.weights_materialized:
        return None
    recorder = _OutputDropout(ctx.model)
    try:
        with preserved_training_state(ctx):
            ctx.model.train(True)
            with torch.no_grad(), ctx.training.plan.autocast(), recorder:
                ctx.compute_loss(ctx.model, move_to_device(batch, ctx.device))
    except Exception:
        return None
    finally:
        recorder.close()
    output = next((leaf for leaf in leaves(recorder.output[0]) if isinstance(leaf, torch.Tensor)), None) \
        if recorder.output else None
    if output is None or not output.is_floating_point():
        return None
    root = output._base if output._base is not None else output
    return next((rate for dropped, rate in recorder.dropped
                 if dropped is output or dropped is root or dropped._base is root), None)


class DropoutOnOutputCheck(Check):
    """DROPOUT_ON_OUTPUT: a regression model whose last operation is a dropout."""

    name = "step.output_dropout"
    stage = Stage.STEP
    codes = ("DROPOUT_ON_OUTPUT",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        criteria = [call.function for call in get_probe(ctx).criterion_calls]
        regression = [name for name in criteria if name in REGRESSION_CRITERIA]
        findings.data["summary"] = "no regression criterion" if not regression else "the output is no dropout's"
        if not regression:
            return
        rate = output_dropout_rate(ctx)
        if rate is None:
            return
        findings.data.update(rate=rate, summary=f"the model's output comes out of a dropout (p={rate:g})")
        findings.warning(
            "DROPOUT_ON_OUTPUT",
            f"the model's output comes straight out of a dropout (p={rate:g}) and is fed to {regression[0]}: in "
            f"training {rate:.0%} of the predictions are zeroed and the rest scaled by 1/(1 - p), so the loss is "
            f"minimised by predicting (1 - p) = {1 - rate:.2g} times the target, and in eval mode, with dropout off, "
            "every prediction comes out that much too small. A dropout placed after the last layer "
            "(nn.Sequential(..., nn.Linear(h, 1), nn.Dropout(p))) regularises nothing and biases the output",
            "Move the dropout before the last layer (nn.Dropout(p), then nn.Linear(h, 1)), or remove it; dropout "
            "belongs on hidden activations, never on the prediction.",
            "model",
        )
