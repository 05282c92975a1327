"""NeMo Safe Synthesizer's preflight parameter counting and bytes per base weight: the
names and signatures of its ``preflight/checks/environment.py`` functions.

The counts are the core's (``memory.params``): these names only keep NSS's calls
working. ``bytes_per_base_weight`` also reads NSS's training settings
(``TrainingHyperparams``: ``peft_implementation``, ``quantize_model``,
``quantization_bits``, ``quantization_scheme``), directly or under a whole config's
``training`` node; any other argument goes to ``memory.params.bytes_per_weight``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import nn

from optimus_preflight.memory.param_configs import config_field, has_field
from optimus_preflight.memory.params import (
    base_model_param_count,
    bytes_per_weight,
    dtype_bytes,
    meta_param_count,
    shape_param_count,
)

log = logging.getLogger(__name__)

__all__ = ["param_count_from_empty_model", "estimate_params_from_shape", "estimate_base_model_params",
           "bytes_per_base_weight"]

# NSS's TrainingHyperparams: peft_implementation ('lora', 'QLORA', later 'loftq'),
# quantize_model (default False), quantization_bits (4 or 8, default 8), and in later
# versions quantization_scheme (with effective_bits).
NSS_KEYS = ("peft_implementation", "quantize_model", "quantization_bits", "quantization_scheme")
_PEFT_IMPLEMENTATIONS = ("lora", "qlora", "loftq")
_NSS_DEFAULT_BITS = 8


def param_count_from_empty_model(factory: Callable[[], nn.Module] | Any) -> int | None:
    """Count parameters by instantiating the model on the meta device (NSS's name).

    ``factory``: a callable returning an ``nn.Module``, or a Hugging Face config (NSS
    passes an ``AutoConfig``). None when the model cannot be built on meta; callers fall
    back to ``estimate_params_from_shape``. Details: ``memory.params.meta_param_count``.
    """
    return meta_param_count(factory)


def estimate_params_from_shape(
    config: Any = None,
    *,
    hidden_size: int | None = None,
    num_hidden_layers: int | None = None,
    intermediate_size: int | None = None,
    num_attention_heads: int | None = None,
    num_key_value_heads: int | None = None,
    vocab_size: int | None = None,
    tie_word_embeddings: bool | None = None,
    head_dim: int | None = None,
    attention_bias: bool | None = None,
    mlp_bias: bool | None = None,
) -> int:
    """Shape-only fallback parameter count (NSS's name): a decoder with GQA attention
    and a gated MLP unless the config's ``model_type`` says otherwise; keywords
    (``hidden_size=``, ``num_hidden_layers=``, ...) override the config's values.
    Details: ``memory.params.shape_param_count``."""
    return shape_param_count(
        config, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers, intermediate_size=intermediate_size,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads, vocab_size=vocab_size,
        tie_word_embeddings=tie_word_embeddings, head_dim=head_dim, attention_bias=attention_bias, mlp_bias=mlp_bias,
    )


def estimate_base_model_params(config_or_factory: Any) -> tuple[int, Literal["exact", "approximate"]] | None:
    """``(n_params, method)`` for the base model, or None if unknown (NSS's name):
    ``"exact"`` from the meta-device build, ``"approximate"`` from the shape formula.
    Details: ``memory.params.base_model_param_count``."""
    return base_model_param_count(config_or_factory)


def training_settings(config: Any) -> Any:
    """The node holding NSS training fields: ``config`` itself, or a whole NSS config's ``training``."""
    if config is not None and not any(has_field(config, key) for key in NSS_KEYS):
        training = config_field(config, "training")
        if training is not None and any(has_field(training, key) for key in NSS_KEYS):
            return training
    return config


def nss_bytes_per_weight(settings: Any, weight_bytes: float) -> float:
    """NSS's rule: quantize_model decides; the PEFT name only stands in when it is absent."""
    peft = config_field(settings, "peft_implementation")
    if peft is not None and (not isinstance(peft, str) or peft.lower() not in _PEFT_IMPLEMENTATIONS):
        accepted = ", ".join(repr(name) for name in _PEFT_IMPLEMENTATIONS)
        raise ValueError(f"peft_implementation must be one of {accepted} (any case), got {peft!r}")
    bits = config_field(settings, "quantization_bits")
    if bits is not None and (isinstance(bits, bool) or bits not in (4, 8)):
        raise ValueError(f"quantization_bits must be 4 or 8, got {bits!r}")
    quantize = config_field(settings, "quantize_model")
    if quantize is not None and not isinstance(quantize, bool):
        raise ValueError(f"quantize_model must be true or false, got {quantize!r}")
    if quantize is None:
        quantize = peft is not None and peft.lower() in ("qlora", "loftq")
    elif not quantize and peft is not None and peft.lower() != "lora":
        # NSS's own default is peft_implementation='QLORA' with quantize_model=False: bf16 base weights.
        log.debug("peft_implementation=%r with quantize_model=False: base weights unquantized", peft)
    if not quantize:
        return weight_bytes
    scheme = config_field(settings, "quantization_scheme")
    if scheme is not None:
        effective = getattr(scheme, "effective_bits", None)
        if isinstance(effective, bool) or not isinstance(effective, (int, float)) or effective <= 0:
            raise ValueError(f"quantization_scheme must carry a positive effective_bits, got {scheme!r}")
        bits = effective
    return (bits or _NSS_DEFAULT_BITS) / 8 + 0.1


def bytes_per_base_weight(
    mode: str | Any = "full",
    *,
    quant_bits: int | None = None,
    weight_dtype: str | torch.dtype | None = None,
    optimizer_states: int = 2,
) -> float:
    """Bytes of training memory per base-model weight, activations aside (NSS's
    ``bytes_per_base_weight(training_cfg)``).

    With NSS training settings (any of ``peft_implementation``, ``quantize_model``,
    ``quantization_bits``, ``quantization_scheme``; also under a ``training`` node):
    never full training. ``quantize_model`` decides: true gives ``bits / 8 + 0.1`` with
    ``quantization_scheme.effective_bits``, else ``quantization_bits``, else NSS's
    default 8; false gives 2 bytes (``weight_dtype``, default bf16), even with
    ``peft_implementation='QLORA'`` (NSS's default pairing). Without ``quantize_model``,
    ``peft_implementation`` 'qlora'/'loftq' means quantized and 'lora' does not (any
    case). Values outside 'lora'/'qlora'/'loftq', 4/8 and booleans raise ValueError
    naming the key.

    Anything else (a mode string, a bitsandbytes config, a config with ``mode``
    fields, one with none: LoRA) is ``memory.params.bytes_per_weight``'s.
    """
    if not isinstance(mode, (str, int, float, bytes)):
        settings = training_settings(mode)
        if settings is not None and any(has_field(settings, key) for key in NSS_KEYS):
            return nss_bytes_per_weight(settings, float(dtype_bytes(weight_dtype or "bf16")))
    return bytes_per_weight(mode, quant_bits=quant_bits, weight_dtype=weight_dtype,
                            optimizer_states=optimizer_states)
