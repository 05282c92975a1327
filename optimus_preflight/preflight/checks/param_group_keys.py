"""A param-group key the optimizer never reads (``model.param_group_keys``), meant to be
applied by someone else; another optimizer's name for a key it does read (``wd``,
``learning_rate``) is ``model.optimizer``'s OPTIM_GROUP_UNKNOWN_KEY.

``torch.optim`` keeps every key of a param group and reads only its own hyperparameters
(``optimizer.defaults``: lr, betas, weight_decay, ...). A per-group ``lr_scale``,
``lr_mult``, ``layer_decay`` or ``weight_decay_rate`` copied from code whose scheduler
applies it (timm's schedulers, MAE/BEiT's ``adjust_learning_rate``, mmcv's paramwise
config) does nothing on its own: the group trains at the optimizer's lr, and a head meant
to train 100x faster than its backbone barely moves.

Quiet where something may read the key: a scheduler that is not one of torch's own, or
any loaded module outside torch and the standard library whose source reads the key from
a group (``group["lr_scale"]``, ``group.get("lr_scale")``), the way a hand-written
``adjust_learning_rate`` in the user's loop does.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.checks.model_checks import misnamed_group_keys
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

# Written by torch itself: named parameters, and what torch's schedulers keep in a group.
TORCH_GROUP_KEYS = frozenset({"params", "param_names", "initial_lr", "max_lr", "min_lr", "base_momentum",
                              "max_momentum", "swa_lr"})
# A key named like a hyperparameter or a multiplier of one (not a label such as "name").
HYPERPARAMETER_NAME = re.compile(r"(^|_)(lr|learning|scale|mult|multiplier|factor|decay|wd|momentum|beta)s?($|_)",
                                 re.IGNORECASE)
NEUTRAL = 1.0  # a scale or multiplier of 1 changes nothing, read or not


def unread_keys(optimizer: torch.optim.Optimizer) -> dict[str, list[tuple[int, float]]]:
    """``{key: [(group index, value), ...]}`` for numeric, hyperparameter-named keys of the
    param groups that the optimizer does not read, where some group's value would change
    its training (a scale other than 1, or any value of another kind of key)."""
    known = set(optimizer.defaults) | TORCH_GROUP_KEYS
    found: dict[str, list[tuple[int, float]]] = {}
    for index, group in enumerate(optimizer.param_groups):
        misnamed = misnamed_group_keys(group, optimizer.defaults)  # OPTIM_GROUP_UNKNOWN_KEY names those
        for key, value in group.items():
            if key in known or key in misnamed or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if HYPERPARAMETER_NAME.search(key) and math.isfinite(value):
                found.setdefault(key, []).append((index, float(value)))
    return {key: values for key, values in found.items()
            if not _is_multiplier(key) or any(value != NEUTRAL for _, value in values)}


def _is_multiplier(key: str) -> bool:
    return re.search(r"scale|mult|factor", key, re.IGNORECASE) is not None


@functools.cache
def _excluded_roots() -> tuple[str, ...]:
    roots = {str(Path(torch.__file__).parent), str(Path(__file__).parents[2])}
    for name in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(name)
        if path:
            roots.add(path)
    return tuple(sorted(roots))


def _reads(key: str) -> re.Pattern[str]:
    quoted = f"""['"]{re.escape(key)}['"]"""
    # a subscript that is not the target of an assignment, or a .get/.pop/.setdefault
    return re.compile(rf"\[\s*{quoted}\s*\](?!\s*=[^=])|\.(get|pop)\(\s*{quoted}")


def module_reading(key: str) -> str | None:
    """The name of a loaded module, outside torch, the standard library and this package,
    whose source reads ``key`` from a mapping: something in the process may apply it."""
    pattern = _reads(key)
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or not file.endswith(".py") or file.startswith(_excluded_roots()):
            continue
        try:
            source = Path(file).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if key in source and pattern.search(source):
            return name
    return None


def _hyperparameters(optimizer: torch.optim.Optimizer) -> str:
    numeric = [key for key, value in optimizer.defaults.items()
               if not isinstance(value, bool) and isinstance(value, (int, float, tuple))]
    return ", ".join(numeric) or ", ".join(optimizer.defaults)


def _scheduler_is_torch(scheduler: Any) -> bool:
    return scheduler is None or type(scheduler).__module__.startswith("torch.")


class ParamGroupKeysCheck(Check):
    """PARAM_GROUP_KEY_UNREAD: a hyperparameter-named param-group key that neither the
    optimizer nor anything loaded reads."""

    name = "model.param_group_keys"
    stage = Stage.MODEL
    codes = ("PARAM_GROUP_KEY_UNREAD",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        optimizer = ctx.optimizer
        keys = unread_keys(optimizer)
        findings.data["unread_keys"] = sorted(keys)
        findings.data["summary"] = (f"param groups carry {', '.join(sorted(keys))}, not read by "
                                    f"{type(optimizer).__name__}" if keys else "every param-group key is read")
        if not keys or not _scheduler_is_torch(ctx.scheduler):
            return
        for key, values in keys.items():
            reader = module_reading(key)
            if reader is not None:
                findings.data.setdefault("read_by", {})[key] = reader
                continue
            index, value = next(((i, v) for i, v in values if v != NEUTRAL), values[0])
            group = optimizer.param_groups[index]
            lr = group.get("lr")
            lr_text = f"lr={lr:g}" if isinstance(lr, (int, float)) else "the optimizer's lr"
            scales = "weight_decay" if "decay" in key.lower() else "lr"
            base = group.get(scales)
            scaled = (f"{{'params': ..., {scales!r}: {base * value:g}}}"
                      if _is_multiplier(key) and isinstance(base, (int, float))
                      else "the optimizer's own key ('lr', 'weight_decay', 'momentum', 'betas')")
            findings.warning(
                "PARAM_GROUP_KEY_UNREAD",
                f"param group {index} of {type(optimizer).__name__} carries {key!r}: {value:g}, a key "
                f"{type(optimizer).__name__} does not read (it reads {_hyperparameters(optimizer)}). torch.optim keeps unknown keys in the group and ignores them, and no scheduler or loaded code "
                f"reads {key!r} either, so the group trains with {lr_text} like the others: a scale meant for a new "
                "head or a layer-wise decay (copied from timm or MAE-style code, whose scheduler applies it) has "
                "no effect",
                f"Give the group the hyperparameter itself: {scaled}; or apply the key where the lr is set, every "
                f"step: for g in optimizer.param_groups: g[{scales!r}] = base_{scales} * g.get({key!r}, 1.0).",
                "optimizer",
            )
