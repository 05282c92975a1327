"""Parameter counts without allocating a model, and bytes per base weight by training mode.

``meta_param_count`` builds the model on the meta device (exact, no memory);
``shape_param_count`` is a closed-form count for when only a config is at hand;
``base_model_param_count`` prefers the first and labels which one answered;
``bytes_per_weight`` is the training memory per base weight by training mode. Configs
are read by duck typing (dicts, OmegaConf nodes, Hugging Face configs, plain objects):
``transformers`` is used only when it happens to be installed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import nn

from optimus_preflight.memory.param_configs import (
    ALIASES,
    DEFAULT_VOCAB,
    REQUIRED,
    build_on_meta,
    config_field,
    family_of,
    is_config_like,
    mode_from_config,
    model_type_of,
    shape_value,
)

log = logging.getLogger(__name__)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Unique parameters (tied weights counted once)."""
    unique = {id(p): p for p in model.parameters()}
    return sum(p.numel() for p in unique.values() if p.requires_grad or not trainable_only)


def _meta_count(config_or_factory: Any) -> tuple[int, bool] | None:
    """``(count, exact)`` from a meta-device build; exact is False for an encoder's base model."""
    if is_config_like(config_or_factory):
        built = build_on_meta(config_or_factory)
        return None if built is None else (count_parameters(built[0]), built[1])
    if not callable(config_or_factory):
        return None
    try:
        with torch.device("meta"):
            model = config_or_factory()
    except Exception as error:  # a factory that reads weights or data, or needs a real device
        log.debug("meta-device construction failed: %s", error)
        return None
    return (count_parameters(model), True) if isinstance(model, nn.Module) else None


def meta_param_count(factory: Callable[[], nn.Module] | Any) -> int | None:
    """Count parameters of a model built on the meta device: no memory, no download.

    ``factory`` is a callable returning an ``nn.Module``, or a Hugging Face config: a
    ``PretrainedConfig``, or a dict/OmegaConf node/object with a registered ``model_type``.
    A config builds the first class of ``config.architectures`` that ``transformers``
    exports; without ``architectures``, ``AutoModelForCausalLM`` for decoders and
    ``AutoModel`` (the base model, task head unknown) for encoder-only and encoder-decoder
    configs (a masked-LM family without ``is_decoder``, or ``is_encoder_decoder``). Tied
    weights count once. Returns None when ``transformers`` is missing, the architecture is
    unknown or custom (``trust_remote_code``), or construction fails; callers fall back to
    ``shape_param_count``.
    """
    counted = _meta_count(factory)
    return None if counted is None else counted[0]


def shape_param_count(
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
    """Closed-form parameter count of a transformer from its config; keywords override it.

    ``config`` is a dict, OmegaConf node, Hugging Face config or plain object, read under
    Hugging Face names or their aliases (``n_embd``/``d_model``, ``n_layer``/``num_layers``,
    ``n_head``/``num_heads``, ``n_inner``/``ffn_dim``, ``num_kv_heads``, ``n_positions``).
    ``hidden_size`` (H) and ``num_hidden_layers`` are required (ValueError naming the
    missing ones). Defaults otherwise: vocab 32000, intermediate 4H, H/64 heads, as many KV
    heads as heads, head_dim H/heads, untied embeddings, no biases.

    The default layout is a decoder with GQA attention (Q and O ``H x heads*d``, K and V
    ``H x kv_heads*d``) and a gated SwiGLU MLP (``3 H I``), two RMSNorms per layer, a final
    norm and an LM head unless tied: exact for Llama and Mistral (Qwen2's QKV biases are
    missed, -0.01%). The ``model_type`` selects the non-gated layouts of gpt2,
    gpt_bigcode, opt, gpt_neox, nemotron and the bert/roberta encoders (up/down MLP,
    biases, LayerNorm, learned positions, token types and pooler as each family has them)
    and qwen3's Q/K norms; a config spelled with GPT-2's names and no ``model_type``
    counts as gpt2. Other families get the default layout: a non-gated MLP (falcon, phi,
    ...) is over-counted by half, MoE experts beyond one are not counted.
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
        "max_position_embeddings": None,
        "type_vocab_size": None,
    }
    values = {
        name: value if value is not None else (shape_value(config, name) if config is not None else None)
        for name, value in given.items()
    }
    missing = [name for name in REQUIRED if not values[name]]
    if missing:
        names = "; ".join(f"{name} (or {', '.join(ALIASES[name][1:])})" for name in missing)
        raise ValueError(f"cannot estimate parameters from shape: missing or zero {names}")
    family = family_of(config)
    hidden, layers = int(values["hidden_size"]), int(values["num_hidden_layers"])
    inter = int(values["intermediate_size"] or 4 * hidden)
    heads = int(values["num_attention_heads"] or max(1, hidden // 64))
    kv_heads = values["num_key_value_heads"]
    if kv_heads is None and model_type_of(config) == "gpt_bigcode" and config_field(config, "multi_query") is not False:
        kv_heads = 1  # multi-query attention, gpt_bigcode's default
    kv_heads = int(kv_heads or heads)
    dim = int(values["head_dim"] or max(1, hidden // heads))
    vocab = int(values["vocab_size"] or DEFAULT_VOCAB)
    tied = family.tied if values["tie_word_embeddings"] is None else bool(values["tie_word_embeddings"])
    attention_has_bias = family.linear_bias if values["attention_bias"] is None else bool(values["attention_bias"])
    mlp_has_bias = family.linear_bias if values["mlp_bias"] is None else bool(values["mlp_bias"])

    q_out, kv_out = heads * dim, kv_heads * dim
    attention = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
    if attention_has_bias:
        attention += q_out + 2 * kv_out + hidden
    projections = 3 if family.gated_mlp else 2
    mlp = projections * hidden * inter
    if mlp_has_bias:
        mlp += (projections - 1) * inter + hidden
    norm = 2 * hidden if family.layer_norm else hidden
    per_layer = attention + mlp + 2 * norm + (2 * dim if family.qk_norm else 0)

    embeddings = vocab * hidden * (1 if tied else 2)
    if family.positions is not None:
        positions = int(values["max_position_embeddings"] or family.positions)
        embeddings += (positions + family.position_offset) * hidden
    extra = 0
    if family.encoder:  # token types, and the pooler AutoModel builds
        embeddings += int(values["type_vocab_size"] or 2) * hidden
        extra = hidden * hidden + hidden
    # one more norm: the decoder's final norm, or the encoder's embedding LayerNorm
    return layers * per_layer + embeddings + norm + extra


def base_model_param_count(config_or_factory: Any) -> tuple[int, Literal["exact", "approximate"]] | None:
    """``(n_params, method)`` for the base model, or None when neither path can count it.

    ``"exact"``: built on the meta device (``meta_param_count``), the declared
    or causal-LM architecture. ``"approximate"``: either the base model of an encoder
    config that declares no ``architectures`` (the task head is unknown), or, when no
    meta build is possible (no ``transformers``, custom architecture), the shape formula
    of ``shape_param_count``: exact on Llama-style and the listed non-gated
    families, otherwise off by up to +50% of the MLP (non-gated) or the missing experts
    (MoE). None for a factory that cannot build on meta, or a config without
    ``hidden_size``/``num_hidden_layers``; flag downstream VRAM estimates as heuristic
    unless exact.
    """
    counted = _meta_count(config_or_factory)
    if counted is not None:
        return counted[0], "exact" if counted[1] else "approximate"
    if callable(config_or_factory) and not is_config_like(config_or_factory):
        return None
    try:
        return shape_param_count(config_or_factory), "approximate"
    except (ValueError, TypeError):  # missing required fields, or non-numeric ones
        return None


_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


def dtype_bytes(weight_dtype: str | torch.dtype) -> int:
    if isinstance(weight_dtype, torch.dtype):
        return torch.empty((), dtype=weight_dtype).element_size()
    if str(weight_dtype) not in _DTYPE_BYTES:
        raise ValueError(f"weight_dtype must be one of {', '.join(_DTYPE_BYTES)}, got {weight_dtype!r}")
    return _DTYPE_BYTES[str(weight_dtype)]


def bytes_per_weight(
    mode: str | Any = "full",
    *,
    quant_bits: int | None = None,
    weight_dtype: str | torch.dtype | None = None,
    optimizer_states: int = 2,
) -> float:
    """Bytes of training memory per base-model weight, activations aside.

    With a mode string (the default is ``"full"``):

    - ``"full"``: the weight, its gradient and ``optimizer_states`` state tensors, all in
      ``weight_dtype`` (default fp32: 16 bytes with Adam/AdamW; autocast keeps fp32
      weights, so bf16 autocast is still 16).
    - ``"lora"``: frozen base weights in ``weight_dtype`` only (default bf16: 2 bytes); the
      adapters, their gradients and optimizer state are small and not counted here.
    - ``"qlora"``: ``quant_bits / 8 + 0.1`` (default 4 bits: 0.6; 8-bit: 1.1): the quantized
      weight plus block scales and the dequantization workspace.

    With a config instead (dict, OmegaConf node, dataclass, pydantic model, any object),
    checked in this order:

    - bitsandbytes style ``load_in_4bit``/``load_in_8bit``: QLoRA at 4 or 8 bits.
    - ``mode``/``quant_bits``/``weight_dtype`` fields, as for the string form.
    - Without a ``mode`` (no recognised field at all included, or None): LoRA, 2 bytes in
      bf16 (QLoRA when ``quant_bits`` is set), logged at debug: a config that names no
      mode describes a parameter-efficient fine-tune.
    """
    if isinstance(mode, (int, float, bytes)):  # bool included
        raise TypeError(f"mode must be a mode string or a training config, got {mode!r}")
    if not isinstance(mode, str):
        mode, quant_bits, weight_dtype = mode_from_config(mode, quant_bits, weight_dtype)
    mode = mode.lower()
    weight_bytes = dtype_bytes(weight_dtype or ("bf16" if mode == "lora" else "fp32"))
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
