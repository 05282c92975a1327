"""Parameter counting on the meta device, the shape formula, and bytes per base weight."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from optimus_preflight.compat.nss import (
    bytes_per_base_weight,
    estimate_base_model_params,
    estimate_params_from_shape,
    param_count_from_empty_model,
)


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class DecoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, inter: int):
        super().__init__()
        head_dim = hidden // heads
        self.q = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.gate = nn.Linear(hidden, inter, bias=False)
        self.up = nn.Linear(hidden, inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)


class Decoder(nn.Module):
    """The shape the formula models: GQA attention, SwiGLU MLP, RMSNorm, optional tied head."""

    def __init__(self, vocab=1000, hidden=64, layers=3, heads=8, kv_heads=2, inter=176, tie=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(DecoderLayer(hidden, heads, kv_heads, inter) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.embed.weight


def hf_like_config(**overrides):
    values = dict(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=176,
        vocab_size=1000,
        tie_word_embeddings=False,
    )
    values.update(overrides)
    return SimpleNamespace(**values, to_dict=lambda: dict(values))


def test_meta_device_count_is_exact_and_allocates_nothing():
    seen = []

    def factory() -> nn.Module:
        model = Decoder()
        seen.append(next(model.parameters()).device)
        return model

    assert param_count_from_empty_model(factory) == sum(p.numel() for p in Decoder().parameters())
    assert seen == [torch.device("meta")]
    # A 70B-shaped stack counts instantly: nothing is allocated.
    assert param_count_from_empty_model(
        lambda: nn.Sequential(*(nn.Linear(8192, 8192) for _ in range(1000)))
    ) == 1000 * (8192 * 8192 + 8192)


def test_tied_weights_are_counted_once():
    tied = param_count_from_empty_model(lambda: Decoder(tie=True))
    untied = param_count_from_empty_model(Decoder)
    assert untied - tied == 1000 * 64


def test_meta_count_returns_none_when_the_factory_cannot_build_on_meta():
    def needs_data() -> nn.Module:
        model = nn.Linear(4, 4)
        if model.weight.sum().item() > 1e9:  # .item() is impossible on meta tensors
            raise AssertionError
        return model

    assert param_count_from_empty_model(needs_data) is None
    assert param_count_from_empty_model(42) is None


@pytest.mark.parametrize("tie", [False, True])
def test_shape_formula_matches_a_built_gqa_swiglu_decoder(tie):
    exact = sum(p.numel() for p in {id(p): p for p in Decoder(tie=tie).parameters()}.values())
    assert estimate_params_from_shape(hf_like_config(tie_word_embeddings=tie)) == exact
    assert estimate_params_from_shape(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=176, vocab_size=1000, tie_word_embeddings=tie,
    ) == exact  # fmt: skip


def test_shape_formula_on_llama2_7b_and_mapping_configs():
    config = {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "intermediate_size": 11008,
        "vocab_size": 32000,
    }
    assert estimate_params_from_shape(config) == 6_738_415_616  # Llama-2-7B's published count
    # keywords override the config
    assert estimate_params_from_shape(config, num_hidden_layers=1) < 1_000_000_000


def test_base_model_params_exact_or_approximate(monkeypatch):
    assert estimate_base_model_params(Decoder) == (sum(p.numel() for p in Decoder().parameters()), "exact")
    # A Hugging Face config without transformers installed: the shape formula, flagged approximate.
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    assert param_count_from_empty_model(hf_like_config()) is None
    count, method = estimate_base_model_params(hf_like_config())
    assert method == "approximate" and count == estimate_params_from_shape(hf_like_config())
    assert estimate_base_model_params({"hidden_size": 8}) is None
    assert estimate_base_model_params(lambda: 42) is None  # a factory that builds no module


def test_bytes_per_base_weight_by_training_mode():
    assert bytes_per_base_weight("full") == 16.0  # fp32 weight + grad + two AdamW states
    assert bytes_per_base_weight("full", weight_dtype=torch.bfloat16) == 8.0
    assert bytes_per_base_weight("full", optimizer_states=1) == 12.0  # SGD with momentum
    assert bytes_per_base_weight("lora") == 2.0
    assert bytes_per_base_weight("qlora", quant_bits=4) == pytest.approx(0.6)
    assert bytes_per_base_weight("qlora", quant_bits=8) == pytest.approx(1.1)
    assert bytes_per_base_weight({"load_in_4bit": True}) == pytest.approx(0.6)
    assert bytes_per_base_weight(SimpleNamespace(mode="lora", weight_dtype="fp32")) == 4.0
    with pytest.raises(ValueError, match="4 or 8"):
        bytes_per_base_weight("qlora", quant_bits=3)
    with pytest.raises(ValueError, match="mode"):
        bytes_per_base_weight("dora")


# --- bytes per base weight from training configs (NeMo Safe Synthesizer and ours) ---------


@dataclass
class NSSTraining:
    """The three fields of NSS's TrainingHyperparams that decide the base-weight precision."""

    peft_implementation: str = "QLORA"
    quantize_model: bool = False
    quantization_bits: int = 8


def _pydantic_form(values):
    pydantic = pytest.importorskip("pydantic")

    class Training(pydantic.BaseModel):
        peft_implementation: str = "QLORA"
        quantize_model: bool = False
        quantization_bits: int = 8

    return Training(**values)


CONFIG_FORMS = {
    "dict": dict,
    "omegaconf": OmegaConf.create,
    "namespace": lambda values: SimpleNamespace(**values),
    "dataclass": lambda values: NSSTraining(**values),
    "pydantic": _pydantic_form,
}


@pytest.mark.parametrize("form", CONFIG_FORMS)
@pytest.mark.parametrize(
    "peft, quantize, bits, expected",
    [
        ("lora", False, 8, 2.0),
        ("LoRA", False, 4, 2.0),
        ("qlora", True, 4, 0.6),
        ("QLORA", True, 8, 1.1),
        ("QLORA", False, 8, 2.0),  # NSS's defaults: the QLORA name alone does not quantize
        ("lora", True, 4, 0.6),  # quantize_model decides, as in NSS
        ("loftq", True, 4, 0.6),
    ],
)
def test_bytes_per_base_weight_follows_nss_training_configs(form, peft, quantize, bits, expected):
    values = {"peft_implementation": peft, "quantize_model": quantize, "quantization_bits": bits}
    assert bytes_per_base_weight(CONFIG_FORMS[form](values)) == pytest.approx(expected)


@pytest.mark.parametrize(
    "config, expected",
    [
        ({"peft_implementation": "qlora"}, 1.1),  # quantized without quantize_model; NSS's default 8 bits
        ({"peft_implementation": "qlora", "quantization_bits": 4}, 0.6),
        ({"peft_implementation": "lora"}, 2.0),
        ({"quantize_model": True}, 1.1),
        ({"quantization_bits": 4}, 2.0),  # bits only matter once quantize_model is on
        ({"quantize_model": True, "quantization_scheme": SimpleNamespace(effective_bits=4)}, 0.6),
        ({"training": {"peft_implementation": "QLORA", "quantize_model": True, "quantization_bits": 4}}, 0.6),
        (OmegaConf.create({"training": {"peft_implementation": "lora"}, "data": {"x": 1}}), 2.0),
    ],
)
def test_bytes_per_base_weight_partial_and_nested_nss_configs(config, expected):
    assert bytes_per_base_weight(config) == pytest.approx(expected)


@pytest.mark.parametrize(
    "config, key, accepted",
    [
        ({"peft_implementation": "prefix"}, "peft_implementation", "'lora', 'qlora', 'loftq'"),
        ({"peft_implementation": "qlora", "quantization_bits": 3}, "quantization_bits", "4 or 8"),
        ({"quantize_model": "yes"}, "quantize_model", "true or false"),
        ({"quantize_model": True, "quantization_scheme": "nf4"}, "quantization_scheme", "effective_bits"),
    ],
)
def test_bytes_per_base_weight_rejects_unknown_nss_values(config, key, accepted):
    with pytest.raises(ValueError, match=key) as raised:
        bytes_per_base_weight(config)
    assert accepted in str(raised.value)


def test_bytes_per_base_weight_defaults_config_to_lora_and_string_calls_to_full(caplog):
    assert bytes_per_base_weight() == 16.0
    assert bytes_per_base_weight("full") == 16.0
    with caplog.at_level(logging.DEBUG, logger="optimus_preflight.memory"):
        for config in ({}, SimpleNamespace(), OmegaConf.create({"lr": 0.1}), None):
            assert bytes_per_base_weight(config) == 2.0
    assert "assuming lora" in caplog.text
    # our own config fields keep their meaning
    assert bytes_per_base_weight({"mode": "full"}) == 16.0
    assert bytes_per_base_weight(OmegaConf.create({"mode": "full", "weight_dtype": "bf16"})) == 8.0
    assert bytes_per_base_weight({"quant_bits": 8}) == pytest.approx(1.1)
    assert bytes_per_base_weight(SimpleNamespace(load_in_8bit=True, load_in_4bit=False)) == pytest.approx(1.1)
    with pytest.raises(ValueError, match="mode"):
        bytes_per_base_weight({"mode": "dora"})
    with pytest.raises(TypeError, match="mode"):
        bytes_per_base_weight(4)


# --- the shape formula: defaults, aliases, config kinds, families --------------------------


def test_shape_formula_fills_documented_defaults():
    # vocab 32000, intermediate 4H, H/64 heads, KV heads = heads, head_dim H/heads, untied
    exact = param_count_from_empty_model(
        lambda: Decoder(vocab=32000, hidden=128, layers=2, heads=2, kv_heads=2, inter=512)
    )
    assert estimate_params_from_shape({"hidden_size": 128, "num_hidden_layers": 2}) == exact
    assert estimate_params_from_shape(hidden_size=128, num_hidden_layers=2) == exact


@pytest.mark.parametrize(
    "config, named, not_named",
    [
        ({"vocab_size": 10}, ["hidden_size", "n_embd", "num_hidden_layers", "n_layer"], []),
        ({"n_embd": 8, "n_head": 2}, ["num_hidden_layers", "n_layer", "num_layers"], ["hidden_size"]),
        (SimpleNamespace(hidden_size=0, num_hidden_layers=2), ["hidden_size", "d_model"], ["num_hidden_layers"]),
    ],
)
def test_shape_formula_requires_hidden_size_and_layers(config, named, not_named):
    with pytest.raises(ValueError) as raised:
        estimate_params_from_shape(config)
    message = str(raised.value)
    assert all(name in message for name in named) and not any(name in message for name in not_named)


def _llama_values():
    return {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 8,
            "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 1000}  # fmt: skip


@pytest.mark.parametrize(
    "make",
    [dict, OmegaConf.create, lambda values: SimpleNamespace(**values)],
    ids=["dict", "omegaconf", "namespace"],
)
def test_shape_formula_reads_every_config_kind(make):
    exact = sum(p.numel() for p in Decoder().parameters())
    assert estimate_params_from_shape(make(_llama_values())) == exact


def test_gpt2_style_config_counts_the_gpt2_layout():
    hidden, layers, vocab, positions = 64, 3, 1000, 128
    gpt2 = {
        "n_embd": hidden,
        "n_layer": layers,
        "n_head": 8,
        "n_inner": None,
        "vocab_size": vocab,
        "n_positions": positions,
    }
    inner = 4 * hidden  # n_inner=None
    attention = 4 * hidden * hidden + 4 * hidden  # c_attn (QKV) and c_proj, with biases
    mlp = 2 * hidden * inner + inner + hidden  # c_fc and c_proj, with biases: not gated
    per_layer = attention + mlp + 2 * 2 * hidden  # two LayerNorms, weight and bias
    expected = vocab * hidden + positions * hidden + layers * per_layer + 2 * hidden  # tied head, final LayerNorm
    assert estimate_params_from_shape(gpt2) == expected
    assert estimate_params_from_shape({**gpt2, "model_type": "gpt2"}) == expected
    # the gated decoder layout would add a third MLP projection per layer
    assert estimate_params_from_shape({**gpt2, "model_type": "llama"}) > expected


# --- against transformers' own models, built on the meta device ----------------------------

TINY = {
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_inner=None, vocab_size=1000, n_positions=128, bos_token_id=0, eos_token_id=0),
    "llama": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, intermediate_size=176, vocab_size=1000),
    "qwen3": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=176, vocab_size=1000, tie_word_embeddings=True),
    "opt": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=256, vocab_size=1000, max_position_embeddings=128, word_embed_proj_dim=64),
    "gpt_neox": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, vocab_size=1000),
    "nemotron": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256, vocab_size=1000),
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=128, bos_token_id=0, eos_token_id=0),
    "bert": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=1000, max_position_embeddings=128),
    "roberta": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=1000, max_position_embeddings=130, type_vocab_size=1),
}  # fmt: skip


def tiny_config(model_type: str, **overrides):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoConfig.for_model(model_type, **{**TINY[model_type], **overrides})


def built_count(cls_name: str, config) -> int:
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = getattr(transformers, cls_name)(config)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


REAL_CLASSES = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "opt": "OPTForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "nemotron": "NemotronForCausalLM",
    "gpt_bigcode": "GPTBigCodeForCausalLM",
    "bert": "BertModel",  # encoders: the base model, as AutoModel builds it
    "roberta": "RobertaModel",
}


@pytest.mark.parametrize("model_type", REAL_CLASSES)
def test_shape_formula_matches_transformers_models(model_type):
    config = tiny_config(model_type)
    real = built_count(REAL_CLASSES[model_type], config)
    assert estimate_params_from_shape(config) == real  # 0% error
    assert estimate_params_from_shape(config.to_dict()) == real  # a loaded config.json reads the same
    if model_type == "gpt2":  # untied, as some GPT-2 fine-tunes ship
        untied = tiny_config("gpt2", tie_word_embeddings=False)
        assert estimate_params_from_shape(untied) == built_count("GPT2LMHeadModel", untied)


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "qwen3", "nemotron"])
def test_meta_count_of_decoder_configs_is_exact(model_type):
    config = tiny_config(model_type)
    real = built_count(REAL_CLASSES[model_type], config)
    assert param_count_from_empty_model(config) == real
    assert estimate_base_model_params(config) == (real, "exact")


def test_bert_without_architectures_counts_the_base_model_as_approximate():
    config = tiny_config("bert")
    base, lm_head = built_count("BertModel", config), built_count("BertLMHeadModel", config)
    assert base != lm_head
    assert param_count_from_empty_model(config) == base
    assert estimate_base_model_params(config) == (base, "approximate")
    # A BERT set up as a decoder is one: AutoModelForCausalLM's BertLMHeadModel, exact.
    decoder = tiny_config("bert", is_decoder=True)
    assert estimate_base_model_params(decoder) == (built_count("BertLMHeadModel", decoder), "exact")


def test_declared_architecture_is_built_and_exact():
    config = tiny_config("bert", architectures=["BertForMaskedLM"])
    masked = built_count("BertForMaskedLM", config)
    assert masked != built_count("BertModel", config)
    assert param_count_from_empty_model(config) == masked
    assert estimate_base_model_params(config) == (masked, "exact")
    # an encoder-decoder without a declared head: the base model, approximate
    bart = pytest.importorskip("transformers").AutoConfig.for_model(
        "bart", d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=100, max_position_embeddings=64,
    )  # fmt: skip
    assert estimate_base_model_params(bart) == (built_count("BartModel", bart), "approximate")


def test_config_dicts_and_objects_with_a_model_type_are_built():
    real = built_count("LlamaForCausalLM", tiny_config("llama"))
    values = {"model_type": "llama", **TINY["llama"]}
    for config in (values, OmegaConf.create(values), SimpleNamespace(**values)):
        assert estimate_base_model_params(config) == (real, "exact")


def test_custom_or_unknown_architectures_fall_back_to_the_shape_formula():
    pytest.importorskip("transformers")
    custom = tiny_config("llama", architectures=["MyCustomLlamaForCausalLM"])  # trust_remote_code style
    assert param_count_from_empty_model(custom) is None
    assert estimate_base_model_params(custom) == (estimate_params_from_shape(custom), "approximate")
    unknown = {"model_type": "not_a_registered_type", "hidden_size": 64, "num_hidden_layers": 2}
    assert param_count_from_empty_model(unknown) is None
    assert estimate_base_model_params(unknown) == (estimate_params_from_shape(unknown), "approximate")


def test_meta_builds_keep_transformers_quiet_and_its_verbosity(capfd):
    transformers = pytest.importorskip("transformers")
    before = transformers.logging.get_verbosity()
    # bos/eos ids outside a tiny vocabulary make transformers warn while the config is built
    config = {"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 100}
    assert param_count_from_empty_model(config) is not None
    assert param_count_from_empty_model(tiny_config("bert")) is not None  # "add is_decoder=True" hint
    assert transformers.logging.get_verbosity() == before
    assert "transformers" not in capfd.readouterr().err
