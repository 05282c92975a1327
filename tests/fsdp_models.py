"""Models for the FSDP2 memory estimate: an MLP stack, a Llama-shaped decoder (tiny for the
tests, 7B-shaped for benchmarks/fsdp_memory.py) and the validation cases that run them.

Everything here is module level so that spawned ranks can unpickle it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


# ------------------------------------------------------------------ MLP stack
class ResidualMLP(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class MLPStack(nn.Module):
    """Odd sizes on purpose: FSDP2 pads dim 0 of 37, 75 and 11 to a multiple of the ranks."""

    def __init__(self, d_in: int = 24, width: int = 37, hidden: int = 75, depth: int = 4, classes: int = 11):
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.layers = nn.ModuleList(ResidualMLP(width, hidden) for _ in range(depth))
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


# ------------------------------------------------------------ Llama-shaped
@dataclass(frozen=True)
class LlamaShape:
    vocab: int = 32000
    hidden: int = 4096
    layers: int = 32
    heads: int = 32
    intermediate: int = 11008
    max_seq: int = 2048


LLAMA_7B = LlamaShape()
LLAMA_TINY = LlamaShape(vocab=96, hidden=32, layers=3, heads=4, intermediate=88, max_seq=16)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.type_as(x)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaBlock(nn.Module):
    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.heads = shape.heads
        h = shape.hidden
        self.attn_norm, self.mlp_norm = RMSNorm(h), RMSNorm(h)
        self.q, self.k, self.v, self.o = (nn.Linear(h, h, bias=False) for _ in range(4))
        self.gate = nn.Linear(h, shape.intermediate, bias=False)
        self.up = nn.Linear(h, shape.intermediate, bias=False)
        self.down = nn.Linear(shape.intermediate, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        y = self.attn_norm(x)
        q, k, v = (proj(y).view(b, t, self.heads, -1).transpose(1, 2) for proj in (self.q, self.k, self.v))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attended.transpose(1, 2).reshape(b, t, c))
        y = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class LlamaLike(nn.Module):
    """Llama's layout (RMSNorm, rotary attention, SwiGLU, untied head), no GQA or cache."""

    def __init__(self, shape: LlamaShape = LLAMA_TINY):
        super().__init__()
        self.embed = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleList(LlamaBlock(shape) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.hidden)
        self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)
        head_dim = shape.hidden // shape.heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device, dtype=torch.float32)
        angles = torch.outer(positions, self.inv_freq)
        cos, sin = (torch.cat((f, f), dim=-1) for f in (angles.cos(), angles.sin()))
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, cos.to(x.dtype), sin.to(x.dtype))
        return self.head(self.norm(x))


def llama_7b() -> LlamaLike:
    return LlamaLike(LLAMA_7B)


# ------------------------------------------------------------------ losses
def classification_loss(model: nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(inputs), targets)


def lm_loss(model: nn.Module, batch):
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()), targets.numel()


def adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def char_transformer() -> nn.Module:
    from optimus_preflight.recipes.char_lm import CharTransformer

    return CharTransformer(vocab_size=98, block_size=32, n_layer=3, n_head=4, d_model=48, dropout=0.0)


def tiny_llama() -> LlamaLike:
    return LlamaLike(LLAMA_TINY)


def _tokens(vocab: int, batch: int, seq: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=generator)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def validation_cases():
    """name -> (model_fn, real batch, loss_fn, build_optimizer, options): the models the
    per-rank estimate is checked against, one with activation checkpointing, one in bf16."""
    generator = torch.Generator().manual_seed(0)
    mlp_batch = (torch.randn(32, 24, generator=generator), torch.randint(0, 11, (32,), generator=generator))
    return {
        "mlp_stack": (MLPStack, mlp_batch, classification_loss, adamw, {"precision": "fp32"}),
        "char_transformer_ac": (char_transformer, _tokens(98, 4, 32, 1), lm_loss, adamw,
                                {"precision": "fp32", "activation_checkpointing": True}),
        "llama_bf16": (tiny_llama, _tokens(96, 4, 16, 2), lm_loss, adamw, {"precision": "bf16"}),
    }

