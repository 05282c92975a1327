"""Memory estimator benchmark: accuracy against measured steps, and a 7B model's cost.

1. A Llama-shaped 7B model (32 layers, hidden 4096, SwiGLU 11008, vocab 32000, seq 2048,
   batch 1, bf16 autocast, AdamW): a full two-step estimate on fake tensors. Wall time
   and the process's peak RSS (measured first, before any real tensors exist) show it
   allocates nothing of the model's size. Targets: < 10 s and < 2 GiB RSS on 2 cores.
2. Accuracy: for an MLP, a CNN with BatchNorm and a transformer with SDPA, in fp32 and
   bf16 autocast, with AdamW and SGD with momentum, the predicted peak vs the peak of
   the same two steps run for real on the CPU (live storage bytes, same tracker).

Run: ``.venv/bin/python benchmarks/memory_estimator.py``. The last line is the headline.
"""

from __future__ import annotations

import resource
import time

import torch
import torch.nn.functional as F
from torch import nn

from optimus_preflight.memory import estimate_step_memory, measure_step_memory
from optimus_preflight.memory.result import gib


# ------------------------------------------------------------- Llama-shaped model
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(dim), Attention(dim, heads, kv_heads)
        self.mlp_norm, self.mlp = RMSNorm(dim), SwiGLU(dim, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab=32000, dim=4096, layers=32, heads=32, kv_heads=32, hidden=11008, max_seq=2048):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(DecoderLayer(dim, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(max_seq).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x, cos, sin = self.embed(ids), self.cos[:t], self.sin[:t]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def lm_loss(model: nn.Module, batch) -> torch.Tensor:
    ids, targets = batch
    return F.cross_entropy(model(ids).flatten(0, 1).float(), targets.flatten())


# --------------------------------------------------------------- accuracy models
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 10))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        layers, channels = [], 3
        for width in (32, 64, 128):
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2)]
            channels = width
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(channels, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class Transformer(nn.Module):
    """GPT-style: LayerNorm, fused QKV attention with SDPA, GELU MLP."""

    def __init__(self, vocab=512, dim=256, layers=4, heads=4, max_seq=128):
        super().__init__()
        self.tok, self.pos, self.heads = nn.Embedding(vocab, dim), nn.Embedding(max_seq, dim), heads
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln1": nn.LayerNorm(dim),
                    "qkv": nn.Linear(dim, 3 * dim),
                    "proj": nn.Linear(dim, dim),
                    "ln2": nn.LayerNorm(dim),
                    "mlp": nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)),
                }
            )
            for _ in range(layers)
        )
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        b, t = ids.shape
        x = self.tok(ids) + self.pos(torch.arange(t))
        for block in self.blocks:
            q, k, v = (
                z.view(b, t, self.heads, -1).transpose(1, 2)
                for z in block["qkv"](block["ln1"](x)).split(x.shape[-1], 2)
            )
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + block["proj"](y.transpose(1, 2).reshape(b, t, -1))
            x = x + block["mlp"](block["ln2"](x))
        return self.head(self.ln(x))


def classification_loss(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


ACCURACY_CASES = {
    "mlp": (MLP, lambda: (torch.randn(64, 512), torch.randint(0, 10, (64,))), classification_loss),
    "cnn_batchnorm": (CNN, lambda: (torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))), classification_loss),
    "transformer_sdpa": (
        Transformer,
        lambda: (torch.randint(0, 512, (8, 128)), torch.randint(0, 512, (8, 128))),
        lm_loss,
    ),
}
OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
}


def llama_7b_estimate(device: str = "cpu"):
    batch = (
        torch.empty(1, 2048, dtype=torch.long, device="meta"),
        torch.empty(1, 2048, dtype=torch.long, device="meta"),
    )
    started = time.perf_counter()
    estimate = estimate_step_memory(Llama, batch, lm_loss, OPTIMIZERS["adamw"], precision="bf16", device=device)
    return estimate, time.perf_counter() - started


def main() -> None:
    torch.manual_seed(0)
    print("== 7B Llama-shaped model: two-step estimate (bf16 autocast, AdamW, batch 1 x 2048) ==")
    estimate, seconds = llama_7b_estimate()
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    params = sum(p.numel() for p in _meta(Llama).parameters())
    print(f"parameters          {params / 1e9:.3f} B")
    print(f"estimate            {estimate.describe()}  [{estimate.method}]")
    print(f"detail              {', '.join(f'{k} {gib(v)}' for k, v in estimate.detail.items())}")
    print(f"wall time           {seconds:.2f} s (cold: includes fake-tensor warm-up)")
    print(f"peak RSS            {rss_mib:.0f} MiB (whole process, torch included)")
    cuda, cuda_seconds = llama_7b_estimate("cuda")
    print(
        f"CUDA target         {cuda.describe()}; allocator peak {gib(cuda.allocator_peak_bytes)}, "
        f"reserved {gib(cuda.reserved_bytes)} ({cuda_seconds:.2f} s; foreach AdamW)"
    )

    print("\n== accuracy: predicted vs measured peak of the same two real CPU steps ==")
    print(
        f"{'model':18s} {'precision':9s} {'optimizer':13s} {'predicted':>12s} {'measured':>12s} {'error':>8s} {'est. s':>7s} {'real s':>7s}  peak at"
    )
    worst = 0.0
    for name, (model_fn, make_batch, loss_fn) in ACCURACY_CASES.items():
        batch = make_batch()
        for precision in ("fp32", "bf16"):
            for optimizer_name, optimizer_fn in OPTIMIZERS.items():
                predicted = estimate_step_memory(model_fn, batch, loss_fn, optimizer_fn, precision=precision)
                measured = measure_step_memory(model_fn, batch, loss_fn, optimizer_fn, precision=precision)
                error = (predicted.peak_bytes - measured.peak_bytes) / measured.peak_bytes
                worst = max(worst, abs(error))
                print(
                    f"{name:18s} {precision:9s} {optimizer_name:13s} {predicted.peak_bytes:12d} {measured.peak_bytes:12d} "
                    f"{error:+8.3%} {predicted.elapsed_s:7.2f} {measured.elapsed_s:7.2f}  {predicted.peak_at}"
                )
    print(f"\nmemory_accuracy_max_abs_error_pct={worst * 100:.3f}")
    print(f"memory_7b_estimate_peak_rss_mib={rss_mib:.0f}")
    print(f"memory_7b_estimate_s={seconds:.2f}")


def _meta(factory):
    with torch.device("meta"):
        return factory()


if __name__ == "__main__":
    main()
