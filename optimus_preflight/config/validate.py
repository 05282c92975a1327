"""Semantic validation of a composed config, before any model, data or file is touched.

Types and unknown keys are already enforced by the schemas at composition time; this
module checks values, and names the key and the fix in every message: first that every
interpolation resolves, then every number against the range its schema field declares
(``schema.ranged``: one place per field, also for a recipe's own dataclasses), then the
rules below for choices and names. trainer.device and
trainer.precision are checked where they are resolved against the machine
(training/precision.py), the one place that knows them.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError, InterpolationToMissingValueError, OmegaConfBaseException

from optimus_preflight.config.invocation import program
from optimus_preflight.config.schema import (
    EXTRA_SIGNALS,
    FAIL_ON,
    MONITOR_MODES,
    PROGRESS_MODES,
    RANGE,
    STRATEGIES,
    Range,
)
from optimus_preflight.errors import UserError


@dataclass(frozen=True)
class Rule:
    key: str
    ok: Callable[[Any], bool]
    requirement: str
    fix: str


RULES = (
    Rule("trainer.early_stopping.mode", lambda v: v in MONITOR_MODES, "must be min or max", "Set trainer.early_stopping.mode=min for a loss, max for an accuracy."),
    Rule("checkpoint.monitor", lambda v: v is None or str(v).startswith("val_"), "must name an evaluation metric (val_loss, val_<name>) or be null", "Set checkpoint.monitor=val_loss, or val_<name> for a metric your validation_step returns or logs."),
    Rule("trainer.early_stopping.monitor", lambda v: v is None or str(v).startswith("val_"), "must name an evaluation metric (val_loss, val_<name>) or be null", "Set trainer.early_stopping.monitor=val_loss, or val_<name> for a metric your validation_step returns or logs."),
    Rule("checkpoint.mode", lambda v: v in MONITOR_MODES, "must be min or max", "Set checkpoint.mode=min for a loss, max for an accuracy."),
    Rule("trainer.strategy", lambda v: v in STRATEGIES, f"must be one of {'|'.join(STRATEGIES)}", "Set trainer.strategy=ddp (replicate the model) or trainer.strategy=fsdp (shard it)."),
    Rule("trainer.micro_batch_size", lambda v: v is None or v == "auto" or (type(v) is int and v >= 1),
         "must be a positive integer, auto or null",
         "Set trainer.micro_batch_size=auto (the largest micro-batch that fits memory), a positive integer dividing "
         "data.batch_size x trainer.accumulation_steps, or null (micro-batches of data.batch_size)."),
    Rule("trainer.compile_mode", lambda v: v in (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"), "must be null, default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs", "Set trainer.compile_mode=null for torch's default."),
    Rule("logging.progress", lambda v: v in PROGRESS_MODES, f"must be one of {'|'.join(PROGRESS_MODES)}", "Set logging.progress=auto."),
    Rule("checkpoint.extra_signal", lambda v: v is None or v in EXTRA_SIGNALS, f"must be one of {', '.join(EXTRA_SIGNALS)} or null",
         "Set checkpoint.extra_signal=SIGUSR1 (what SLURM sends ahead of its time limit), or null for none."),
    Rule("preflight.fail_on", lambda v: v in FAIL_ON, f"must be one of {'|'.join(FAIL_ON)}", "Set preflight.fail_on=error."),
)


def _lookup(cfg: DictConfig, key: str) -> tuple[bool, Any]:
    value = OmegaConf.select(cfg, key, default=_MISSING, throw_on_missing=False)
    return value is not _MISSING, value


_MISSING = object()


def _dataclass_nodes(node: DictConfig, prefix: str = "") -> Iterator[tuple[str, DictConfig, type]]:
    """Every node of the config built from a dataclass schema (its full key, the node,
    the dataclass): Hydra keeps the schema type on each composed node."""
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            path = f"{prefix}{key}"
            kind = OmegaConf.get_type(child)
            if dataclasses.is_dataclass(kind):
                yield path, child, kind
            yield from _dataclass_nodes(child, path + ".")


def _leaves(node: Any, prefix: str) -> Iterator[tuple[str, Any, Any]]:
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node)) if isinstance(node, ListConfig) else ()
    for key in keys:
        child = node._get_node(key)
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(child, (DictConfig, ListConfig)) and not child._is_interpolation():
            yield from _leaves(child, path)
        else:
            yield path, node, key


def check_interpolations(cfg: DictConfig) -> None:
    """An interpolation that points nowhere (``trainer.max_steps=${nope.x}``) or does not
    parse is a user error naming the key, not a traceback at its first read. Errors of
    resolvers that only work inside a running app (``${hydra:...}``) are left to it."""
    for key, parent, name in _leaves(cfg, ""):
        child = parent._get_node(name)
        if child is None or not child._is_interpolation():
            continue
        try:
            parent[name]
        except (InterpolationKeyError, InterpolationToMissingValueError) as error:
            raise UserError(f"{key}={child._value()} points to a key that has no value ({str(error).splitlines()[0]})",
                            key=key, fix=f"Point {key} at an existing key (see `{program()} --cfg job`), or give it a value.") from None
        except OmegaConfBaseException as error:
            if "HydraConfig was not set" in str(error):
                continue
            raise UserError(f"{key}={child._value()} cannot be resolved: {str(error).splitlines()[0]}",
                            key=key, fix=f"Fix the interpolation in {key} (syntax: ${{group.key}}), or give it a value.") from None


def _optional(kind: type, name: str) -> bool:
    try:
        hint = typing.get_type_hints(kind)[name]
    except Exception:  # a recipe's annotation that does not resolve: say nothing of null
        return False
    return type(None) in typing.get_args(hint)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**64 else f"{value:g}"


def _bound_text(rng: Range, value: float) -> str:
    """The bound the value breaks, as the message states it."""
    if math.isnan(value):
        return "must be a number, not nan"
    if value not in rng and not ((value > rng.lo) if rng.lo_open else (value >= rng.lo)):
        return f"must be {'>' if rng.lo_open else '>='} {_number(rng.lo)}"
    return f"must be {'<' if rng.hi_open else '<='} {_number(rng.hi)}"


def _range_errors(cfg: DictConfig) -> Iterator[tuple[bool, UserError]]:
    """(whether the value is an interpolation, the error) for each number out of range."""
    for path, node, kind in _dataclass_nodes(cfg):
        for spec in dataclasses.fields(kind):
            rng = spec.metadata.get(RANGE)
            if rng is None or spec.name not in node:
                continue
            value = node[spec.name]
            values = list(value) if isinstance(value, ListConfig) else [value]
            for item in values:
                if item is None or isinstance(item, bool) or not isinstance(item, (int, float)):
                    continue  # null is the type's business; a recipe may replace the node
                if item in rng and not math.isnan(item):
                    continue
                key = f"{path}.{spec.name}"
                example = rng.example if rng.example is not None else spec.default
                if isinstance(example, tuple):
                    example = f"[{','.join(map(str, example))}]"
                null = " or null" if _optional(kind, spec.name) else ""
                yield node._get_node(spec.name)._is_interpolation(), UserError(
                    f"{key} {_bound_text(rng, item)}{null}, got {value!r}.", key=key, fix=f"Set {key}={example}{rng.hint}.")
                break


def check_ranges(cfg: DictConfig) -> None:
    """Every number against the range its schema field declares (``schema.ranged``).
    A value set directly is named before one that interpolates it (``data.train.block_size=0``,
    not the ``model.block_size`` that follows it)."""
    errors = sorted(_range_errors(cfg), key=lambda found: found[0])
    if errors:
        raise errors[0][1]


def validate_config(cfg: DictConfig) -> None:
    """Raise UserError for the first invalid value."""
    check_interpolations(cfg)
    check_ranges(cfg)
    if OmegaConf.select(cfg, "trainer.max_steps") is None and OmegaConf.select(cfg, "trainer.max_epochs") is None:
        raise UserError("neither trainer.max_steps nor trainer.max_epochs is set: the run would never end",
                        key="trainer.max_steps",
                        fix="Set trainer.max_steps=1000 (optimizer steps) or trainer.max_epochs=10 (passes over the data).")
    for rule in RULES:
        present, value = _lookup(cfg, rule.key)
        if not present:
            continue  # a user recipe may replace a group (e.g. an optimizer without lr)
        if not rule.ok(value):
            raise UserError(f"{rule.key} {rule.requirement}, got {value!r}.", key=rule.key, fix=rule.fix)
