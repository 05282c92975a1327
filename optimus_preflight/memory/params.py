"""Parameter counts without allocating a model, and bytes per base weight by training mode.

``param_count_from_empty_model`` builds the model on the meta device (exact, no
memory); ``estimate_params_from_shape`` is the decoder-only GQA + SwiGLU formula for
when only a config is at hand. Hugging Face configs are accepted by duck typing
(``hidden_size``, ``num_hidden_layers``, ...): ``transformers`` is used only when it
happens to be installed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

# A few families name the same quantities differently (GPT-2 style configs).
_ALIASES = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "n_inner"),
    "vocab_size": ("vocab_size",),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads"),
    "head_dim": ("head_dim",),
    "tie_word_embeddings": ("tie_word_embeddings",),
    "attention_bias": ("attention_bias",),
    "mlp_bias": ("mlp_bias",),
}
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def _get(config: Any, name: str) -> Any:
    for alias in _ALIASES[name]:
        value = config.get(alias) if isinstance(config, Mapping) else getattr(config, alias, None)
        if value is not None:
            return value
    return None


def _looks_like_hf_config(obj: Any) -> bool:
    return hasattr(obj, "model_type") and hasattr(obj, "to_dict") and not isinstance(obj, nn.Module)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Unique parameters (tied weights counted once)."""
    unique = {id(p): p for p in model.parameters()}
    return sum(p.numel() for p in unique.values() if p.requires_grad or not trainable_only)


def param_count_from_empty_model(factory: Callable[[], nn.Module] | Any) -> int | None:
    """Count parameters of a model built on the meta device: exact, no memory, no download.

    ``factory`` is a callable returning an ``nn.Module`` or a Hugging Face config (built
    with ``AutoModelForCausalLM.from_config`` when ``transformers`` is installed).
    Returns None when the model cannot be built this way.
    """
    build: Callable[[], nn.Module]
    if _looks_like_hf_config(factory):
        try:
            from transformers import AutoModelForCausalLM  # optional; never a dependency
        except ImportError:
            return None

        def build() -> nn.Module:
            return AutoModelForCausalLM.from_config(factory)

    elif callable(factory):
        build = factory
    else:
        return None
    try:
        with torch.device("meta"):
            model = build()
    except Exception as error:  # unsupported architecture, custom code, a factory that loads weights
        log.debug("meta-device construction failed: %s", error)
        return None
    if not isinstance(model, nn.Module):
        return None
    return count_parameters(model)


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
    """Parameters of a decoder-only transformer with GQA attention and a SwiGLU MLP.

    Per layer: Q and O projections ``H x (n_heads * d)``, K and V ``H x (n_kv * d)``,
    gate/up/down ``3 x H x I``, two RMSNorm weights; plus the embedding, the final norm
    and an untied LM head. Takes a config object or mapping (Hugging Face names) and/or
    keywords (keywords win). Non-gated MLPs are over-counted by a third of the MLP.
    """
    given = {
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "intermediate_size": intermediate_size,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "vocab_size": vocab_size,
        "tie_word_embeddings": tie_word_embeddings,
        "head_dim": head_dim,
        "attention_bias": attention_bias,
        "mlp_bias": mlp_bias,
    }
    values = {
        name: value if value is not None else (_get(config, name) if config is not None else None)
        for name, value in given.items()
    }
    missing = [name for name in _REQUIRED if values[name] is None]
    if missing:
        raise ValueError(f"cannot estimate parameters from shape: missing {', '.join(missing)}")
    hidden, layers, inter = (
        int(values["hidden_size"]),
        int(values["num_hidden_layers"]),
        int(values["intermediate_size"]),
    )
    heads, vocab = int(values["num_attention_heads"]), int(values["vocab_size"])
    kv_heads = int(values["num_key_value_heads"] or heads)
    dim = int(values["head_dim"] or hidden // heads)
    q_out, kv_out = heads * dim, kv_heads * dim
    attention = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
    if values["attention_bias"]:
        attention += q_out + 2 * kv_out + hidden
    mlp = 3 * hidden * inter + (2 * inter + hidden if values["mlp_bias"] else 0)
    per_layer = attention + mlp + 2 * hidden
    embeddings = vocab * hidden * (1 if values["tie_word_embeddings"] else 2)
    return layers * per_layer + embeddings + hidden


def estimate_base_model_params(config_or_factory: Any) -> tuple[int, str] | None:
    """``(count, "exact")`` from a meta-device build, else ``(count, "approximate")`` from
    the shape formula, else None. The formula's error on common decoder-only families is
    small for gated MLPs and up to +33% of the MLP for non-gated ones."""
    exact = param_count_from_empty_model(config_or_factory)
    if exact is not None:
        return exact, "exact"
    if callable(config_or_factory) and not _looks_like_hf_config(config_or_factory):
        return None
    try:
        return estimate_params_from_shape(config_or_factory), "approximate"
    except ValueError:
        return None


_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


def bytes_per_base_weight(
    mode: str | Any = "full",
    *,
    quant_bits: int | None = None,
    weight_dtype: str | torch.dtype | None = None,
    optimizer_states: int = 2,
) -> float:
    """Bytes of training memory per base-model weight, activations aside.

    - ``"full"``: the weight, its gradient and ``optimizer_states`` state tensors, all in
      ``weight_dtype`` (default fp32: 16 bytes with Adam/AdamW; autocast keeps fp32
      weights, so bf16 autocast is still 16).
    - ``"lora"``: frozen base weights in ``weight_dtype`` only (default bf16: 2 bytes); the
      adapters, their gradients and optimizer state are small and not counted here.
    - ``"qlora"``: ``quant_bits / 8 + 0.1`` (4-bit: 0.6, 8-bit: 1.1): the quantized
      weight plus block scales and the dequantization workspace.

    ``mode`` may also be an object or mapping with ``mode``/``quant_bits``/
    ``weight_dtype`` fields, or a bitsandbytes-style config (``load_in_4bit``/``load_in_8bit``).
    """
    if not isinstance(mode, str):
        settings = mode
        read = (
            settings.get if isinstance(settings, Mapping) else lambda key, default=None: getattr(settings, key, default)
        )
        if read("load_in_4bit", False) or read("load_in_8bit", False):
            quant_bits = 4 if read("load_in_4bit", False) else 8
            mode = "qlora"
        else:
            quant_bits = read("quant_bits", quant_bits)
            weight_dtype = read("weight_dtype", weight_dtype)
            mode = read("mode", "qlora" if quant_bits else "full")
    mode = str(mode).lower()
    if weight_dtype is None:
        weight_dtype = "bf16" if mode == "lora" else "fp32"
    if isinstance(weight_dtype, torch.dtype):
        weight_bytes = torch.empty((), dtype=weight_dtype).element_size()
    else:
        if str(weight_dtype) not in _DTYPE_BYTES:
            raise ValueError(f"weight_dtype must be one of {', '.join(_DTYPE_BYTES)}, got {weight_dtype!r}")
        weight_bytes = _DTYPE_BYTES[str(weight_dtype)]
    if mode == "qlora":
        bits = quant_bits or 4
        if bits not in (4, 8):
            raise ValueError(f"QLoRA quantizes to 4 or 8 bits, got {bits}")
        return bits / 8 + 0.1
    if mode == "lora":
        return float(weight_bytes)
    if mode == "full":
        return float(weight_bytes * (2 + optimizer_states))
    raise ValueError(f"mode must be full, lora or qlora, got {mode!r}")
