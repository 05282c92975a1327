"""The default recipe: a character-level decoder-only transformer trained on Python code.

The corpus is the standard library of the running Python (its ``.py`` files, found at
run time), so the recipe needs no download. Read top to bottom: vocabulary, corpus,
dataset, model, recipe, config schemas.
"""

from __future__ import annotations

import functools
import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from optimus_preflight.config.schema import ranged
from optimus_preflight.recipe import TrainRecipe
from optimus_preflight.training.distributed import unwrap

# ---------------------------------------------------------------- vocabulary
# A fixed vocabulary (not one derived from the corpus) keeps token ids, and so golden
# losses, identical across Python versions. Id 0 stands for any other byte.
CHARS = "\n\t" + "".join(chr(code) for code in range(32, 127))
VOCAB_SIZE = len(CHARS) + 1
_BYTE_TO_ID = bytes((CHARS.index(chr(b)) + 1) if chr(b) in CHARS else 0 for b in range(256))


def encode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(text.encode("utf-8").translate(_BYTE_TO_ID)), dtype=torch.uint8)


def decode(ids: torch.Tensor) -> str:
    return "".join(CHARS[i - 1] if i > 0 else "?" for i in ids.tolist())


# -------------------------------------------------------------------- corpus
SKIPPED_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_source_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not SKIPPED_DIRS.intersection(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


@functools.lru_cache(maxsize=4)
def stdlib_corpus(max_chars: int) -> torch.Tensor:
    """Token ids of the first ``max_chars`` characters of the sorted stdlib sources."""
    parts, total = [], 0
    for path in stdlib_source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text[: max_chars - total])
        total += len(parts[-1])
        if total >= max_chars:
            break
    if not parts:
        raise FileNotFoundError(f"no .py files under {sysconfig.get_paths()['stdlib']}")
    return encode("".join(parts))


# ------------------------------------------------------------------- dataset
class CharWindows(Dataset):
    """Non-overlapping windows of ``block_size + 1`` tokens: input and next-token target."""

    def __init__(self, tokens: torch.Tensor, block_size: int):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.tokens = tokens
        self.block_size = block_size

    def __len__(self) -> int:
        return max((len(self.tokens) - 1) // self.block_size, 0)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.block_size
        chunk = self.tokens[start : start + self.block_size + 1].long()
        return chunk[:-1], chunk[1:]


def stdlib_char_windows(split: str, block_size: int, max_chars: int, val_fraction: float) -> CharWindows:
    """The last ``val_fraction`` of the corpus is held out for validation."""
    tokens = stdlib_corpus(max_chars)
    boundary = int(len(tokens) * (1.0 - val_fraction))
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    return CharWindows(tokens[:boundary] if split == "train" else tokens[boundary:], block_size)


# --------------------------------------------------------------------- model
class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        q, k, v = (t.view(batch, time, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(batch, time, channels))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int, dropout: float):
        super().__init__()
        if n_head < 1 or d_model % n_head:
            raise ValueError(f"d_model ({d_model}) must be a positive multiple of n_head ({n_head})")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if n_layer < 1:
            raise ValueError(f"n_layer must be >= 1, got {n_layer}")
        self.block_size = block_size
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections keeps the stream's variance flat.
        for name, param in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.token_embedding(ids) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, new_tokens: int, temperature: float = 0.8) -> torch.Tensor:
        for _ in range(new_tokens):
            logits = self(ids[:, -self.block_size :])[:, -1] / temperature
            ids = torch.cat([ids, torch.multinomial(F.softmax(logits.float(), dim=-1), 1)], dim=1)
        return ids


# -------------------------------------------------------------------- recipe
class CharLMRecipe(TrainRecipe):
    """Next-character prediction; every builder comes from the config's ``_target_`` nodes."""

    # The model and data options (conf/model/char_transformer.yaml, conf/data/stdlib_chars.yaml:
    # YAML, because the model's block_size follows the data's) and this recipe's tuned values.
    model_config = "char_transformer"
    data_config = "stdlib_chars"
    config_defaults = {
        "trainer": {"max_steps": 400, "clip_grad_norm": 1.0, "eval_every_n_steps": 100, "eval_max_batches": 20},
        "optimizer": ("adamw", {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}),
        "scheduler": ("warmup_cosine", {"warmup_steps": 40}),
    }

    def compute_loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, int]:
        inputs, targets = batch
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        # Every position is a target (no padding), so the count is known without a sync.
        return loss, targets.numel()

    def sample(self, prompt: str = "def ", new_tokens: int = 200) -> str:
        """A few lines of generated code: the quickest sanity check of what it learned."""
        model = unwrap(self.model)
        was_training = model.training
        model.eval()
        ids = encode(prompt).long().unsqueeze(0).to(self.training_context.device)
        with self.training_context.plan.autocast():
            out = model.generate(ids, new_tokens)
        model.train(was_training)
        return decode(out[0].cpu())


# ------------------------------------------------------------ config schemas
@dataclass
class CharTransformerConfig:
    _target_: str = "optimus_preflight.recipes.char_lm.CharTransformer"
    vocab_size: int = ranged(VOCAB_SIZE, 1)
    block_size: int = ranged(128, 1)
    n_layer: int = ranged(4, 1)
    n_head: int = ranged(4, 1)
    d_model: int = ranged(128, 1)
    dropout: float = ranged(0.0, 0, 1, hi_open=True)


@dataclass
class StdlibCharWindowsConfig:
    _target_: str = "optimus_preflight.recipes.char_lm.stdlib_char_windows"
    split: str = "train"
    block_size: int = ranged(128, 1)
    max_chars: int = ranged(4_000_000, 2, hint=" (characters of the corpus to read)")
    val_fraction: float = ranged(0.05, 0, 1, hi_open=True, hint=" (the share of the corpus held out)")


def register_schemas(store) -> None:
    store.store(group="model", name="char_transformer_schema", node=CharTransformerConfig)
    store.store(group="dataset", name="stdlib_char_windows_schema", node=StdlibCharWindowsConfig)
