"""What the CREDIT-shaped functions read from a training config: loader settings and
input shapes, from CREDIT's layout or ours, best effort.

Every reader returns ``None`` for "absent or unusable" and never raises (see
``config.lenient``). Readers log at DEBUG why a layout is incomplete: that is how a 0.0
estimate or a skipped check is explained.

CREDIT's keys (from ``credit/trainers/preflight.py`` and its model constructors):
- loader: ``trainer.thread_workers`` (default 4), ``trainer.prefetch_factor`` (4),
  ``trainer.train_batch_size`` (1);
- a sample: ``model.image_height`` x ``model.image_width`` (721 x 1440) and, from the
  first entry of ``data.source`` (e.g. ``data.source.ERA5``): ``levels`` (a list),
  ``variables.prognostic.vars_3D`` / ``vars_2D`` and ``variables.diagnostic.vars_2D``;
- the model input: ``model.frames`` (history length, default 1), ``model.channels``
  (3-D variables), ``model.levels`` (a count), ``model.surface_channels`` and
  ``model.input_only_channels``.

Ours (``config/schema.py``): ``data.batch_size``, ``data.num_workers``,
``data.prefetch_factor`` (null: torch's default), ``data.pin_memory``; the character LM
reads ``data.train.block_size`` (or ``model.block_size``) and ``model.vocab_size``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import ListConfig

from optimus_preflight.config.lenient import as_bool, as_int, conf_get
from optimus_preflight.preflight.loader_startup import LoaderSettings

log = logging.getLogger("optimus_preflight")

FLOAT32_BYTES = 4
TOKEN_BYTES = 8  # int64 token ids, as the dataset yields them
# CREDIT's defaults where its config leaves a key out (0.25-degree ERA5, 4 workers).
CREDIT_HEIGHT, CREDIT_WIDTH = 721, 1440
CREDIT_WORKERS, CREDIT_PREFETCH, CREDIT_BATCH = 4, 4, 1
_UNUSABLE = object()


def _setting(conf: Any, key: str, default: Any, minimum: int = 0) -> Any:
    """An int setting: ``default`` when absent or null, ``_UNUSABLE`` when present but not usable."""
    raw = conf_get(conf, key)
    if raw is None:
        return default
    value = as_int(raw, minimum)
    if value is None:
        log.debug("preflight config: %s=%r is not an integer >= %d", key, raw, minimum)
        return _UNUSABLE
    return value


def _names(value: Any) -> list[Any] | None:
    """A list of variable names: null is none (``vars_2D:`` left empty in YAML), one
    string is one name; anything else is unusable."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple, ListConfig)):
        return list(value)
    return None


def _level_count(value: Any) -> int | None:
    """``levels``: a list of levels (data.source) or a count (the model's config)."""
    if isinstance(value, (list, tuple, ListConfig)):
        return len(value)
    return as_int(value)


# ------------------------------------------------------------------ loader settings
def is_credit_layout(conf: Any) -> bool:
    """CREDIT's trainer keys or its ``data.source`` block are there."""
    keys = ("trainer.thread_workers", "trainer.train_batch_size", "data.source")
    return any(conf_get(conf, key) is not None for key in keys)


def is_our_layout(conf: Any) -> bool:
    return any(conf_get(conf, key) is not None for key in ("data.batch_size", "data.num_workers", "data.train"))


def credit_loader_settings(conf: Any) -> LoaderSettings | None:
    """CREDIT's loader settings, with CREDIT's defaults for absent keys; None when one
    is present but unusable. CREDIT's config has no pin_memory key to suggest."""
    workers = _setting(conf, "trainer.thread_workers", CREDIT_WORKERS)
    prefetch = _setting(conf, "trainer.prefetch_factor", CREDIT_PREFETCH, minimum=1)
    batch = _setting(conf, "trainer.train_batch_size", CREDIT_BATCH, minimum=1)
    if _UNUSABLE in (workers, prefetch, batch):
        return None
    return LoaderSettings(batch, workers, prefetch, False, "trainer.thread_workers", "trainer.prefetch_factor",
                          "trainer.train_batch_size", None)


def our_loader_settings(conf: Any) -> LoaderSettings | None:
    """Our ``data.*`` loader settings with the schema's defaults; None when one is
    present but unusable."""
    batch = _setting(conf, "data.batch_size", None, minimum=1)
    workers = _setting(conf, "data.num_workers", 0)
    prefetch = _setting(conf, "data.prefetch_factor", None, minimum=1)
    pin_raw = conf_get(conf, "data.pin_memory")
    pin = False if pin_raw is None else as_bool(pin_raw)
    if _UNUSABLE in (batch, workers, prefetch) or pin is None:
        if pin is None:
            log.debug("preflight config: data.pin_memory=%r is not a boolean", pin_raw)
        return None
    return LoaderSettings(batch, workers, prefetch, pin, "data.num_workers", "data.prefetch_factor",
                          "data.batch_size", "data.pin_memory")


def config_loader_settings(conf: Any) -> LoaderSettings | None:
    """Ours where the config has our ``data`` keys, else CREDIT's where it has CREDIT's
    keys; None for a config with neither (or with unusable values)."""
    if is_our_layout(conf):
        return our_loader_settings(conf)
    if is_credit_layout(conf):
        return credit_loader_settings(conf)
    return None


# ------------------------------------------------------------------ sample sizes
@dataclass(frozen=True)
class CreditSample:
    height: int
    width: int
    channels: int  # n_vars_3D x n_levels + n_vars_2D + n_diagnostic_2D

    @property
    def nbytes(self) -> int:
        """Input and target, each H x W x channels float32."""
        return 2 * self.height * self.width * self.channels * FLOAT32_BYTES


def credit_sample(conf: Any) -> CreditSample | None:
    """One CREDIT sample's shape from ``data.source`` (its first entry) and the model's
    image size; None when incomplete. Zero channels is returned as such (CREDIT: 0.0)."""
    sources = conf_get(conf, "data.source")
    if sources is None:  # not CREDIT's layout: nothing to explain
        return None
    source = next(iter(sources.values()), None) if isinstance(sources, Mapping) else None
    if not isinstance(source, Mapping):
        log.debug("preflight config: data.source=%r holds no source block (e.g. data.source.ERA5)", sources)
        return None
    counts = {}
    for key in ("variables.prognostic.vars_3D", "variables.prognostic.vars_2D", "variables.diagnostic.vars_2D"):
        names = _names(conf_get(source, key))
        if names is None:
            log.debug("preflight config: data.source.<first>.%s is not a list of names", key)
            return None
        counts[key] = len(names)
    n_3d = counts["variables.prognostic.vars_3D"]
    levels = _level_count(conf_get(source, "levels"))
    if levels is None and n_3d:
        # 3-D variables without levels: the channel count is unknown, not "the 2-D ones".
        log.debug("preflight config: data.source.<first>.levels is not a list but %d 3-D variables are listed", n_3d)
        return None
    channels = n_3d * (levels or 0) + counts["variables.prognostic.vars_2D"] + counts["variables.diagnostic.vars_2D"]
    height = _setting(conf, "model.image_height", CREDIT_HEIGHT, minimum=1)
    width = _setting(conf, "model.image_width", CREDIT_WIDTH, minimum=1)
    if _UNUSABLE in (height, width):
        return None
    return CreditSample(height, width, channels)


def lm_block_size(conf: Any) -> int | None:
    """Tokens per sample: the dataset's windows, else the model's context."""
    for key in ("data.train.block_size", "model.block_size"):
        value = as_int(conf_get(conf, key), minimum=1)
        if value is not None:
            return value
    return None


def lm_sample_bytes(conf: Any) -> int | None:
    """Our sequence datasets: inputs and targets of ``block_size`` int64 tokens each."""
    block = lm_block_size(conf)
    return 2 * block * TOKEN_BYTES if block else None


# ------------------------------------------------------------------ model inputs
@dataclass(frozen=True)
class SyntheticInput:
    """A zero-filled batch of the shape the config says the model takes (a
    ``memory.gpu_step.BatchMaker``)."""

    layout: str  # "credit" or "char_lm"
    shape: tuple[int, ...]
    dtype: torch.dtype
    with_targets: bool  # (inputs, targets) of the same shape, as our LM batches

    def make(self, device: torch.device | str) -> Any:
        inputs = torch.zeros(self.shape, dtype=self.dtype, device=device)
        return (inputs, torch.zeros(self.shape, dtype=self.dtype, device=device)) if self.with_targets else inputs

    def describe(self) -> str:
        dims = "(batch, channels, frames, height, width)" if self.layout == "credit" else "(batch, block_size)"
        return f"zero {str(self.dtype).removeprefix('torch.')} {dims}={self.shape}" + (
            " inputs and targets" if self.with_targets else "")


def credit_model_input(conf: Any) -> SyntheticInput | None:
    """CREDIT's model input: ``frames x (channels x levels + surface_channels +
    input_only_channels)`` values per grid point, laid out as CREDIT's models take it,
    ``(batch, channels x levels + surface + input_only, frames, height, width)``.

    CREDIT's own preflight flattens frames into channels (a 4-D tensor); its models'
    ``forward`` takes this 5-D layout (CrossFormer embeds it with a Conv3d, or squeezes
    or pools the frame axis). The element count, hence the memory, is the same."""
    channels = _setting(conf, "model.channels", 0)
    levels = _level_count(conf_get(conf, "model.levels"))
    surface = _setting(conf, "model.surface_channels", 0)
    input_only = _setting(conf, "model.input_only_channels", 0)
    frames = _setting(conf, "model.frames", 1, minimum=1)
    if _UNUSABLE in (channels, surface, input_only, frames):
        return None
    if levels is None and (channels or conf_get(conf, "model.levels") is not None):
        log.debug("preflight config: model.levels=%r is not a count of levels", conf_get(conf, "model.levels"))
        return None
    per_frame = channels * (levels or 0) + surface + input_only
    if per_frame == 0:
        return None
    height = _setting(conf, "model.image_height", CREDIT_HEIGHT, minimum=1)
    width = _setting(conf, "model.image_width", CREDIT_WIDTH, minimum=1)
    batch = _setting(conf, "trainer.train_batch_size", CREDIT_BATCH, minimum=1)
    if _UNUSABLE in (height, width, batch):
        return None
    return SyntheticInput("credit", (batch, per_frame, frames, height, width), torch.float32, with_targets=False)


def lm_model_input(conf: Any) -> SyntheticInput | None:
    """Our character LM: ``(data.batch_size, block_size)`` int64 token ids (zeros are
    valid ids for any ``model.vocab_size`` >= 1), with targets of the same shape."""
    batch = as_int(conf_get(conf, "data.batch_size"), minimum=1)
    block = lm_block_size(conf)
    vocab = as_int(conf_get(conf, "model.vocab_size"), minimum=1)
    if batch is None or block is None or vocab is None:
        return None
    return SyntheticInput("char_lm", (batch, block), torch.long, with_targets=True)


def synthetic_input(conf: Any) -> SyntheticInput | None:
    """The zero batch the config implies: CREDIT's layout first, then our LM; None
    (logged at DEBUG) when neither is complete."""
    for reader in (credit_model_input, lm_model_input):
        spec = reader(conf)
        if spec is not None:
            return spec
    log.debug("preflight config: no input shape: neither CREDIT's model.channels/levels/surface_channels/"
              "input_only_channels nor data.batch_size with block_size and model.vocab_size")
    return None
