"""The settings a mixin takes: our ``TrainerConfig`` however it is held.

The mixins' constructors follow the optimus_dl interface (``TrainingContextMixin(
optimization_config)``, ``TrainingIterationMixin(optimization_config, log_freq)``), where
the argument is that project's own config object. Ours accepts the trainer settings as a
``TrainerConfig``, the ``trainer`` node of a composed config (or the whole config), a
mapping of its keys, or an object shaped like optimus_dl's (``amp.enabled``/``amp.dtype``,
``acc_steps``, ``clip_grad_norm``), and reads every other value from the schema defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Union

from omegaconf import DictConfig, OmegaConf

from optimus_preflight.config.schema import TrainerConfig
from optimus_preflight.errors import UserError

TrainerSettings = Union[TrainerConfig, DictConfig]
_TRAINER_KEYS = {f.name for f in fields(TrainerConfig)}
_AMP_PRECISION = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def trainer_options(config: Any = None) -> TrainerSettings:
    """The trainer settings in ``config`` (see the module docstring); None: the defaults.
    A composed config's node is kept as it is, so later changes to it are seen."""
    if config is None:
        return TrainerConfig()
    if isinstance(config, TrainerConfig):
        return config
    if isinstance(config, DictConfig):
        return config.trainer if "trainer" in config else _merged(OmegaConf.to_container(config, resolve=True))
    if isinstance(config, Mapping):
        return _merged(dict(config.get("trainer", config)))
    if hasattr(config, "amp") or hasattr(config, "acc_steps"):
        return _merged(_from_optimus_dl(config))
    raise UserError(f"the mixin's optimization_config must be a TrainerConfig, a config node or a mapping, got {type(config).__name__}",
                    key="optimization_config", fix="Pass optimus_preflight.config.schema.TrainerConfig(...) or cfg.trainer.")


def _merged(values: dict[str, Any]) -> DictConfig:
    unknown = sorted(set(values) - _TRAINER_KEYS)
    if unknown:
        raise UserError(f"optimization_config has keys a trainer config does not: {', '.join(unknown)}",
                        key=f"trainer.{unknown[0]}", fix=f"Use the keys of TrainerConfig ({', '.join(sorted(_TRAINER_KEYS))}).")
    return OmegaConf.merge(OmegaConf.structured(TrainerConfig), values)


def _from_optimus_dl(config: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    amp = getattr(config, "amp", None)
    if amp is not None:
        dtype = str(getattr(amp, "dtype", "float16")).removeprefix("torch.")
        values["precision"] = _AMP_PRECISION.get(dtype, "fp16") if getattr(amp, "enabled", False) else "fp32"
    if getattr(config, "acc_steps", None):
        values["accumulation_steps"] = int(config.acc_steps)
    if getattr(config, "clip_grad_norm", None) is not None:
        values["clip_grad_norm"] = float(config.clip_grad_norm)
    return values
