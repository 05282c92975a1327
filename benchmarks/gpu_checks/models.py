"""The models of the memory check: six families, each at a GPU size (``full``) and a size
that traces in well under a second on a CPU (``tiny``).

Every ``model_fn`` builds on the current default device (the estimator calls it under fake
tensors, the measurement under ``torch.device("cuda")``), and every forward creates its
index tensors on the input's device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from benchmarks.memory_estimator import Llama


class MLP(nn.Module):
    def __init__(self, inputs: int, width: int, depth: int, classes: int):
        super().__init__()
        layers: list[nn.Module] = []
        for index in range(depth):
            layers += [nn.Linear(inputs if index == 0 else width, width), nn.GELU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """Conv + BatchNorm + ReLU + max-pool stages, then a linear head."""

    def __init__(self, widths: tuple[int, ...], classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for width in widths:
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2)]
            channels = width
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class GPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT2(nn.Module):
    """GPT-2 shaped (learned positions, pre-LayerNorm, fused QKV, SDPA, GELU MLP, untied head).
    ``checkpointing``: each block's activations are recomputed in backward (non-reentrant)."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, max_seq: int, checkpointing: bool = False):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(max_seq, dim)
        self.blocks = nn.ModuleList(GPTBlock(dim, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        self.checkpointing = checkpointing

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing and self.training else block(x)
        return self.head(self.ln(x))


def char_lm(vocab: int, block: int, layers: int, heads: int, dim: int) -> nn.Module:
    """The default recipe's model (recipes/char_lm.py)."""
    from optimus_preflight.recipes.char_lm import CharTransformer

    return CharTransformer(vocab, block, layers, heads, dim, 0.0)


def classification_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(inputs), targets)


def lm_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    ids, targets = batch
    return F.cross_entropy(model(ids).flatten(0, 1).float(), targets.flatten())


@dataclass(frozen=True)
class ModelCase:
    name: str
    model_fn: Callable[[], nn.Module]
    make_batch: Callable[[], Any]  # real CPU tensors (the estimate uses their shapes only)
    loss_fn: Callable[[nn.Module, Any], Any]
    description: str


def _tokens(vocab: int, batch: int, seq: int) -> Callable[[], Any]:
    def make() -> Any:
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (batch, seq + 1), generator=generator)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    return make


def _images(batch: int, size: int, classes: int) -> Callable[[], Any]:
    return lambda: (torch.randn(batch, 3, size, size), torch.randint(0, classes, (batch,)))


def _vectors(batch: int, inputs: int, classes: int) -> Callable[[], Any]:
    return lambda: (torch.randn(batch, inputs), torch.randint(0, classes, (batch,)))


def model_cases(tiny: bool) -> dict[str, ModelCase]:
    if tiny:
        gpt = dict(vocab=128, dim=32, layers=2, heads=2, max_seq=16)
        return {
            "mlp": ModelCase("mlp", lambda: MLP(32, 64, 2, 10), _vectors(8, 32, 10), classification_loss, "MLP 32-64-64-10"),
            "cnn_bn": ModelCase("cnn_bn", lambda: CNN((4, 8)), _images(2, 16, 10), classification_loss, "CNN+BN 4,8 @16px"),
            "char_lm": ModelCase("char_lm", lambda: char_lm(98, 16, 1, 2, 32), _tokens(98, 4, 16), lm_loss, "char-LM d32 L1"),
            "gpt2": ModelCase("gpt2", lambda: GPT2(**gpt), _tokens(128, 2, 16), lm_loss, "GPT-2-like d32 L2"),
            "llama": ModelCase("llama", lambda: Llama(128, 32, 2, 2, 2, 64, 16), _tokens(128, 2, 16), lm_loss,
                               "Llama-like d32 L2"),
            "gpt2_ckpt": ModelCase("gpt2_ckpt", lambda: GPT2(**gpt, checkpointing=True), _tokens(128, 2, 16), lm_loss,
                                   "GPT-2-like d32 L2, activation checkpointing"),
        }
    gpt = dict(vocab=50304, dim=768, layers=12, heads=12, max_seq=1024)
    return {
        "mlp": ModelCase("mlp", lambda: MLP(1024, 4096, 4, 1000), _vectors(1024, 1024, 1000), classification_loss,
                         "MLP 1024-4x4096-1000, batch 1024"),
        "cnn_bn": ModelCase("cnn_bn", lambda: CNN((64, 128, 256)), _images(64, 128, 10), classification_loss,
                            "CNN+BatchNorm 64/128/256, batch 64 x 3x128x128"),
        "char_lm": ModelCase("char_lm", lambda: char_lm(98, 256, 6, 8, 512), _tokens(98, 64, 256), lm_loss,
                             "recipe char-LM d512 L6, batch 64 x 256"),
        "gpt2": ModelCase("gpt2", lambda: GPT2(**gpt), _tokens(50304, 8, 1024), lm_loss,
                          "GPT-2 small (124M), batch 8 x 1024"),
        "llama": ModelCase("llama", lambda: Llama(32000, 2048, 16, 16, 16, 5504, 2048), _tokens(32000, 2, 2048), lm_loss,
                           "Llama-like ~0.94B (d2048 L16), batch 2 x 2048"),
        "gpt2_ckpt": ModelCase("gpt2_ckpt", lambda: GPT2(**gpt, checkpointing=True), _tokens(50304, 16, 1024), lm_loss,
                               "GPT-2 small with activation checkpointing, batch 16 x 1024"),
    }


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adamw_foreach": lambda params: torch.optim.AdamW(params, lr=1e-4, foreach=True),
    "adamw_fused": lambda params: torch.optim.AdamW(params, lr=1e-4, fused=True),
    # foreach left open: torch picks foreach on CUDA, and so does the estimate for a CUDA target.
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
}

# (model, precision, optimizer). One case per model comes first, so a run that hits its
# time budget still has every model once.
FULL_MATRIX = [
    ("mlp", "fp32", "adamw_foreach"), ("cnn_bn", "bf16", "sgd_momentum"), ("char_lm", "bf16", "adamw_fused"),
    ("gpt2", "bf16", "adamw_foreach"), ("llama", "bf16", "adamw_fused"), ("gpt2_ckpt", "bf16", "adamw_fused"),
    ("mlp", "bf16", "adamw_foreach"), ("mlp", "fp16", "adamw_foreach"), ("mlp", "fp32", "adamw_fused"),
    ("mlp", "bf16", "adamw_fused"), ("mlp", "fp16", "adamw_fused"), ("mlp", "fp32", "sgd_momentum"),
    ("mlp", "bf16", "sgd_momentum"), ("mlp", "fp16", "sgd_momentum"),
    ("cnn_bn", "fp32", "adamw_foreach"), ("cnn_bn", "fp16", "adamw_foreach"), ("cnn_bn", "fp32", "sgd_momentum"),
    ("cnn_bn", "bf16", "adamw_fused"),
    ("char_lm", "fp32", "adamw_foreach"), ("char_lm", "fp16", "adamw_foreach"), ("char_lm", "fp32", "sgd_momentum"),
    ("gpt2", "fp32", "adamw_foreach"), ("gpt2", "bf16", "adamw_fused"), ("gpt2", "fp16", "adamw_fused"),
    ("gpt2", "bf16", "sgd_momentum"),
    ("llama", "bf16", "adamw_foreach"), ("llama", "fp32", "sgd_momentum"),
    ("gpt2_ckpt", "fp32", "adamw_foreach"),
]
TINY_MATRIX = [
    ("mlp", "fp32", "adamw_foreach"), ("cnn_bn", "fp16", "sgd_momentum"), ("char_lm", "bf16", "adamw_fused"),
    ("gpt2", "fp32", "adamw_fused"), ("llama", "bf16", "adamw_foreach"), ("gpt2_ckpt", "bf16", "sgd_momentum"),
]


def parameter_count(model_fn: Callable[[], nn.Module]) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in model_fn().parameters())
