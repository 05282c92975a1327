"""Reading the configs ``optimus_preflight.memory.params`` accepts, and meta-device builds.

Model configs (dicts, OmegaConf nodes, Hugging Face configs, plain objects) are read by
duck typing under Hugging Face names and their aliases; ``FAMILIES`` holds the layout
facts a config does not state. Training configs are bitsandbytes' (``load_in_4bit``,
``load_in_8bit``) or carry our fields (``mode``, ``quant_bits``, ``weight_dtype``). ``transformers`` is an optional extra: it is imported only inside
``build_on_meta``, whose None then sends callers to the shape formula.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)


def config_field(config: Any, key: str) -> Any:
    """``config[key]`` for mappings (dicts, OmegaConf), ``config.key`` for objects; None when absent."""
    try:
        return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)
    except Exception:  # OmegaConf raises on a mandatory '???' value: as good as absent here
        return None


def has_field(config: Any, key: str) -> bool:
    """Whether ``config`` declares ``key`` at all, whatever its value (None included)."""
    return key in config if isinstance(config, Mapping) else hasattr(config, key)


def model_type_of(config: Any) -> str | None:
    value = config_field(config, "model_type")
    return value if isinstance(value, str) and value else None


def is_config_like(obj: Any) -> bool:
    """A Hugging Face config, or a mapping/object naming a ``model_type``: to be built, not called."""
    return not isinstance(obj, (nn.Module, type)) and model_type_of(obj) is not None


# Families name the same quantities differently (GPT-2: n_embd/n_layer/n_head/n_inner/n_positions).
ALIASES = {
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
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
    "type_vocab_size": ("type_vocab_size",),
}
REQUIRED = ("hidden_size", "num_hidden_layers")
DEFAULT_VOCAB = 32_000  # Llama/Mistral's


def shape_value(config: Any, name: str) -> Any:
    """The first of ``name``'s aliases the config sets to something other than None."""
    for alias in ALIASES[name]:
        value = config_field(config, alias)
        if value is not None:
            return value
    return None


@dataclass(frozen=True)
class Family:
    """The layout facts a config does not state; defaults describe a Llama-style decoder."""

    gated_mlp: bool = True  # gate/up/down (SwiGLU, GeGLU) rather than up/down
    linear_bias: bool = False  # when the config has no attention_bias/mlp_bias
    layer_norm: bool = False  # LayerNorm (weight + bias) rather than RMSNorm (weight)
    positions: int | None = None  # learned position table rows when the config omits them; None: rotary/none
    position_offset: int = 0  # OPT keeps two extra rows
    tied: bool = False  # tie_word_embeddings when the config omits it
    encoder: bool = False  # token-type embeddings and a pooler: the AutoModel count
    qk_norm: bool = False  # RMSNorm over each Q and K head (head_dim weights each)


_GPT2 = Family(gated_mlp=False, linear_bias=True, layer_norm=True, positions=1024, tied=True)
_BERT = Family(gated_mlp=False, linear_bias=True, layer_norm=True, positions=512, tied=True, encoder=True)
# Families whose layout differs from Llama's, each checked against transformers in the
# tests. Others (falcon, phi, bloom, mpt, gptj, MoE, ...) get the Llama layout.
FAMILIES = {
    "gpt2": _GPT2,
    "gpt_bigcode": _GPT2,
    "opt": Family(gated_mlp=False, linear_bias=True, layer_norm=True, positions=2048, position_offset=2, tied=True),
    "gpt_neox": Family(gated_mlp=False, linear_bias=True, layer_norm=True),
    "nemotron": Family(gated_mlp=False, layer_norm=True),
    "qwen3": Family(qk_norm=True),
    **dict.fromkeys(("bert", "roberta", "xlm-roberta", "camembert"), _BERT),
}


def family_of(config: Any) -> Family:
    """The layout of the config's ``model_type``; Llama's when it has none or an unlisted one."""
    model_type = model_type_of(config) if config is not None else None
    if model_type is not None:
        return FAMILIES.get(model_type, Family())
    # n_embd/n_layer are GPT-2's own names: a config spelled that way is GPT-2 shaped.
    return _GPT2 if config is not None and config_field(config, "n_embd") is not None else Family()


def mode_from_config(settings: Any, quant_bits: int | None, weight_dtype: Any) -> tuple[str, int | None, Any]:
    """``(mode, quant_bits, weight_dtype)`` from a bitsandbytes config or our own fields."""

    def read(key: str, default: Any = None) -> Any:
        value = config_field(settings, key) if settings is not None else None
        return default if value is None else value

    if read("load_in_4bit", False) or read("load_in_8bit", False):  # a bitsandbytes config
        return "qlora", 4 if read("load_in_4bit", False) else 8, weight_dtype
    quant_bits, weight_dtype, mode = read("quant_bits", quant_bits), read("weight_dtype", weight_dtype), read("mode")
    if mode is None:
        # A training config without a mode describes a parameter-efficient fine-tune (full
        # training of a base model is the exception that says so): adapters on frozen weights.
        mode = "qlora" if quant_bits else "lora"
        log.debug("no training mode in the %s given; assuming %s (adapters on frozen base weights)",
                  type(settings).__name__, mode)
    return str(mode), quant_bits, weight_dtype


@contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    # Config validation and model __init__ warn about things that do not change a count
    # (token ids outside a tiny test vocabulary, "add is_decoder=True" hints).
    previous = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(previous)


def _plain_dict(config: Any) -> dict[str, Any]:
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict) and not isinstance(config, Mapping):
        return dict(to_dict())
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):
            return dict(OmegaConf.to_container(config, resolve=True))  # nested nodes become plain
    except ImportError:
        pass
    return dict(config) if isinstance(config, Mapping) else dict(vars(config))


def _as_transformers_config(config: Any, transformers: Any) -> Any:
    if isinstance(config, transformers.PretrainedConfig):
        return config
    values = _plain_dict(config)
    # for_model only instantiates the registered config class: no hub access, no remote code;
    # an unregistered model_type raises ValueError.
    return transformers.AutoConfig.for_model(values.pop("model_type"), **values)


def _declared_class(transformers: Any, name: Any) -> type | None:
    if not isinstance(name, str) or not name.isidentifier():
        return None
    try:
        cls = getattr(transformers, name)
    except (AttributeError, ImportError, RuntimeError):  # custom (trust_remote_code) class, or a broken optional import
        return None
    return cls if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel) else None


def _choose_builder(hf_config: Any, transformers: Any) -> tuple[Callable[[Any], nn.Module], bool] | None:
    declared = getattr(hf_config, "architectures", None) or []
    if declared:
        for name in declared:
            cls = _declared_class(transformers, name)
            if cls is not None:
                return cls, True
        # The config names a class transformers does not have: building another one in its
        # place would count a different architecture and still call it exact.
        log.debug("architectures %s are not transformers classes (custom code?)", declared)
        return None
    from transformers.models.auto import modeling_auto

    model_type = hf_config.model_type
    # AutoModelForCausalLM also maps encoder families (bert -> BertLMHeadModel, bart -> its
    # decoder half), so a causal-LM entry alone does not make a config a decoder.
    encoder = bool(getattr(hf_config, "is_encoder_decoder", False)) or (
        model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(hf_config, "is_decoder", False)
    )
    if model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not encoder:
        return transformers.AutoModelForCausalLM.from_config, True
    # Encoders and encoder-decoders without a declared head: the base model, head unknown.
    return transformers.AutoModel.from_config, False


def build_on_meta(config: Any) -> tuple[nn.Module, bool] | None:
    """Build the model a Hugging Face config describes on the meta device.

    ``config`` is a ``PretrainedConfig`` or a mapping/object with a registered
    ``model_type`` (a loaded ``config.json``, an OmegaConf node). The class is the first of
    ``config.architectures`` that ``transformers`` exports; without ``architectures``,
    ``AutoModelForCausalLM`` for decoders, else ``AutoModel`` (the base model). Returns
    ``(model, exact)`` where ``exact`` is False for that base-model case, or None when
    ``transformers`` is missing, the architecture is unknown or custom, or construction fails.
    """
    try:
        import transformers
    except ImportError:
        return None
    with _quiet(transformers):
        try:
            hf_config = _as_transformers_config(config, transformers)
            choice = _choose_builder(hf_config, transformers)
            if choice is None:
                return None
            builder, exact = choice
            with torch.device("meta"):
                model = builder(hf_config)
        except Exception as error:  # unregistered model_type, inconsistent config, a model that cannot init on meta
            log.debug("meta-device build of %r failed: %s: %s", model_type_of(config), type(error).__name__, error)
            return None
    return (model, exact) if isinstance(model, nn.Module) else None
