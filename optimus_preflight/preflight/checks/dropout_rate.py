"""A dropout probability that reads like a keep-probability (``model.dropout_rate``).

torch's ``p`` (``nn.Dropout(p)``, ``F.dropout(x, p)``, ``nn.LSTM(dropout=...)``, Hugging
Face's ``hidden_dropout_prob``, ``attention_probs_dropout_prob``, ``resid_pdrop``, ...) is
the probability of *zeroing* an activation; TensorFlow 1's ``keep_prob`` and some papers
give the probability of keeping it. 0.1-0.5 is the usual range (0.5 on wide fully
connected layers is classic); at 0.8 and above four in five activations are dropped every
step, which is almost always a keep-probability typed into a drop-probability. At 1.0
every activation is zeroed and nothing downstream can learn.

Read from the modules (dropout layers, and float attributes named like a dropout rate:
what a layer hands to ``F.dropout`` or ``scaled_dot_product_attention(dropout_p=...)``)
and from Hugging Face configs (every float field named like one, nested configs too).
Only parts that train count: a frozen teacher's dropout never runs in training.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from torch import nn

from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

KEEP_LIKE = 0.8  # p at or above this reads as a keep-probability
# dropout, attention_dropout, hidden_dropout_prob, resid_pdrop, drop_rate, drop_path_rate,
# dropout_p; not keep_prob, use_dropout (a bool) or layerdrop's siblings with another meaning.
RATE_NAME = re.compile(r"(dropout|pdrop|drop_prob|drop_rate|drop_path)", re.IGNORECASE)
CONFIG_DEPTH = 2  # a multimodal config's text_config / vision_config


def _is_rate(name: str, value: Any) -> bool:
    return isinstance(value, float) and not isinstance(value, bool) and RATE_NAME.search(name) is not None


def _trains(module: nn.Module) -> bool:
    params = list(module.parameters())
    return not params or any(param.requires_grad for param in params)


def module_rates(model: nn.Module) -> dict[str, float]:
    """``{module name or module.attribute: p}`` at or above KEEP_LIKE, for the modules of
    parts that train."""
    found: dict[str, float] = {}
    parents = dict(model.named_modules())
    for name, module in parents.items():
        parent = parents[name.rpartition(".")[0]] if name else module
        if not _trains(parent):
            continue
        if isinstance(module, nn.modules.dropout._DropoutNd):
            if module.p >= KEEP_LIKE:
                found[f"{name} ({type(module).__name__})" if name else type(module).__name__] = float(module.p)
            continue
        for attribute, value in vars(module).items():
            if _is_rate(attribute, value) and value >= KEEP_LIKE:
                found[f"{name}.{attribute} ({type(module).__name__})" if name else attribute] = value
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


def _listing(rates: dict[str, float], limit: int = 5) -> str:
    items = [f"{name}={value:g}" if name.startswith("config.") else f"{name} p={value:g}" for name, value in rates.items()]
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


class DropoutRateCheck(Check):
    """Dropout probabilities of 0.8 and more: a keep-probability given as ``p``."""

    name = "model.dropout_rate"
    stage = Stage.MODEL
    codes = ("DROPOUT_KEEP_PROB",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        configs = config_rates(ctx.model)
        modules = module_rates(ctx.model)
        # Layers built from a flagged config field carry its value: name the field, once.
        unexplained = {name: p for name, p in modules.items() if p not in configs.values()}
        rates = {**configs, **unexplained}
        findings.data.update(high_rates=len(rates), highest=max(rates.values(), default=None))
        findings.data["summary"] = f"{len(rates)} dropout rate(s) of {KEEP_LIKE:g} or more"
        if not rates:
            return
        everything = [name for name, p in rates.items() if p >= 1.0]
        what = (f"of {KEEP_LIKE:g} or more drop {'every activation' if everything else 'most activations'} in "
                f"training: {_listing(rates)}. p is the probability of ZEROING an activation, not of keeping it")
        consequence = ("; at p=1 the output is all zeros and nothing after it can learn" if everything else
                       "; the network trains on a fifth of its signal or less and underfits")
        where = ("set the config field before the model is built: from_pretrained(name, hidden_dropout_prob=0.1, "
                 "...) or the config you build it from" if configs else
                 "pass the drop probability where the layers are built: nn.Dropout(p=0.1) for a keep-probability of "
                 "0.9 (p = 1 - keep_prob)")
        fix = (f"Use p = 1 - keep_prob (typically 0.1-0.5): {where}.")
        severity = "error" if everything else "warning"
        findings.add(severity, "DROPOUT_KEEP_PROB", f"{len(rates)} dropout rate(s) {what}{consequence}", fix)
