"""Parameter counting on the meta device, the shape formula, and bytes per base weight."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from optimus_preflight.memory import (
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
    # keywords override the config; GPT-2 style names are understood
    assert estimate_params_from_shape(config, num_hidden_layers=1) < 1_000_000_000
    gpt2 = {"n_embd": 64, "n_layer": 3, "n_head": 8, "n_inner": 176, "vocab_size": 1000}
    assert estimate_params_from_shape(gpt2) == estimate_params_from_shape(hf_like_config(num_key_value_heads=8))


def test_shape_formula_names_missing_fields():
    with pytest.raises(ValueError, match="intermediate_size"):
        estimate_params_from_shape(
            {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10}
        )


def test_base_model_params_exact_or_approximate():
    assert estimate_base_model_params(Decoder) == (sum(p.numel() for p in Decoder().parameters()), "exact")
    # A Hugging Face config without transformers installed: the shape formula, flagged approximate.
    count, method = estimate_base_model_params(hf_like_config())
    assert method == "approximate" and count == estimate_params_from_shape(hf_like_config())
    assert estimate_base_model_params({"hidden_size": 8}) is None


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
