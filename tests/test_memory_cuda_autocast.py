"""CUDA's autocast policy emulated on CPU: which ops run in fp32 or lower precision."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from optimus_preflight.memory import estimate_step_memory
from optimus_preflight.memory.cuda_autocast import CudaAutocastPolicy


def test_policy_matches_cuda_autocast_dtypes():
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), CudaAutocastPolicy(torch.bfloat16):
        y = x @ w
        assert y.dtype == torch.bfloat16  # matmuls: lower precision, as on CPU
        assert y.softmax(-1).dtype == torch.float32  # set_opt_dtype ops: fp32 output
        assert F.log_softmax(y, dim=-1).dtype == torch.float32
        assert F.softmax(y, -1, dtype=torch.bfloat16).dtype == torch.bfloat16  # an explicit dtype wins
        assert F.layer_norm(y, (8,)).dtype == torch.float32  # fp32 ops
        assert (y**2).dtype == torch.float32 and y.rsqrt().dtype == torch.float32
        assert torch.mv(x, x[0]).dtype == torch.bfloat16  # lower precision on CUDA only
        with torch.autocast("cpu", enabled=False):
            assert y.softmax(-1).dtype == torch.bfloat16
        loss = (F.layer_norm(y, (8,)) + y.softmax(-1)).sum()
    loss.backward()  # the casts are differentiable
    assert w.grad.dtype == torch.float32


class ManualAttention(nn.Module):
    """Attention with an explicit softmax, whose probabilities CUDA autocast keeps in fp32."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        probs = (q @ k.transpose(-2, -1)).softmax(-1)
        return probs @ v


def test_cuda_target_counts_fp32_softmax_probabilities():
    batch = torch.empty(4, 128, 32, device="meta")

    def loss_fn(model, x):
        return model(x).float().pow(2).mean()

    def estimate(device):
        return estimate_step_memory(
            ManualAttention, batch, loss_fn, lambda p: torch.optim.SGD(p, lr=0.1), precision="bf16", device=device
        )

    cpu, cuda = estimate("cpu"), estimate("cuda")
    probabilities = 4 * 128 * 128
    # Saved for backward: bf16 probabilities on CPU (2 bytes each); on CUDA fp32 ones (4)
    # plus the bf16 copy autocast makes for the second matmul (2).
    assert cuda.peak_bytes - cpu.peak_bytes >= 4 * probabilities
