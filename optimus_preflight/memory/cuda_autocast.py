"""CUDA's autocast op policy, layered on CPU autocast for the simulation of a CUDA step.

The estimate runs on fake CPU tensors, where ``torch.autocast("cpu")`` applies the CPU
op lists. Both devices run matmuls, convolutions and attention in lower precision and
the losses in fp32, but CUDA autocast also runs softmax/log_softmax/sum (output dtype
forced to fp32), layer_norm/group_norm and elementwise exp/log/pow/rsqrt in fp32, and
einsum-like products (mv, addmv, addr) in lower precision. Those differences change
activation sizes (a manual attention's softmax output is twice as large on CUDA), so
this function mode applies them above autograd, where autocast itself works: casts are
recorded by autograd and their saved tensors count as they would on the GPU. Lists
follow ``aten/src/ATen/autocast_mode.h`` (``AT_FORALL_FP32``,
``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_LOWER_PRECISION_FP``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

LOW_PRECISION = (torch.bfloat16, torch.float16)

# Run in fp32: floating lower-precision arguments are cast up.
_FP32 = [
    F.layer_norm, F.group_norm, torch.layer_norm, torch.group_norm, F.softplus, F.cosine_similarity, F.pdist,
    torch.exp, torch.expm1, torch.log, torch.log10, torch.log2, torch.log1p, torch.reciprocal, torch.rsqrt,
    torch.pow, torch.acos, torch.asin, torch.cosh, torch.sinh, torch.tan, torch.erfinv, torch.logsumexp,
    torch.cdist, torch.dist, torch.renorm, torch.norm, torch.Tensor.norm,
    torch.Tensor.exp, torch.Tensor.expm1, torch.Tensor.log, torch.Tensor.log10, torch.Tensor.log2,
    torch.Tensor.log1p, torch.Tensor.reciprocal, torch.Tensor.rsqrt, torch.Tensor.pow, torch.Tensor.__pow__,
    torch.Tensor.__rpow__, torch.Tensor.acos, torch.Tensor.asin, torch.Tensor.cosh, torch.Tensor.sinh,
    torch.Tensor.tan, torch.Tensor.erfinv, torch.Tensor.logsumexp, torch.Tensor.renorm,
]  # fmt: skip
# Output dtype forced to fp32 unless given: {function: position of a positional dtype, or None}.
_FP32_OUTPUT = {
    F.softmax: 3, F.log_softmax: 3, torch.softmax: 2, torch.log_softmax: 2,
    torch.Tensor.softmax: 2, torch.Tensor.log_softmax: 2,
    torch.sum: None, torch.Tensor.sum: None, torch.cumsum: None, torch.Tensor.cumsum: None,
    torch.cumprod: None, torch.Tensor.cumprod: None, torch.prod: None, torch.Tensor.prod: None,
    torch.linalg.vector_norm: None, torch.linalg.matrix_norm: None,
}  # fmt: skip
# Lower precision on CUDA but not in the CPU list.
_LOWER = [
    torch.mv,
    torch.addmv,
    torch.addr,
    torch.chain_matmul,
    torch.linalg.multi_dot,
    torch.Tensor.mv,
    torch.Tensor.addmv,
    torch.Tensor.addr,
]


def _cast(value: Any, dtype: torch.dtype, sources: tuple[torch.dtype, ...]) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype in sources:
        return value.to(dtype)
    if isinstance(value, (list, tuple)) and any(isinstance(item, torch.Tensor) for item in value):
        return type(value)(_cast(item, dtype, sources) for item in value)
    return value


class CudaAutocastPolicy(TorchFunctionMode):
    """Active inside ``torch.autocast("cpu", dtype)``: adds CUDA's fp32 and extra
    lower-precision rules. Does nothing where autocast is disabled."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        self.fp32 = set(_FP32)
        self.lower = set(_LOWER)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)
        if func in self.fp32:
            args = tuple(_cast(arg, torch.float32, LOW_PRECISION) for arg in args)
            kwargs = {key: _cast(value, torch.float32, LOW_PRECISION) for key, value in kwargs.items()}
        elif func in _FP32_OUTPUT:
            position = _FP32_OUTPUT[func]
            first = args[0] if args else kwargs.get("input")
            given = kwargs.get("dtype") is not None or (position is not None and len(args) > position)
            if isinstance(first, torch.Tensor) and first.is_floating_point() and not given:
                kwargs["dtype"] = torch.float32
        elif func in self.lower:
            args = tuple(_cast(arg, self.dtype, (torch.float32,)) for arg in args)
            kwargs = {key: _cast(value, self.dtype, (torch.float32,)) for key, value in kwargs.items()}
        return func(*args, **kwargs)
